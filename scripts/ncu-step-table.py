#!/usr/bin/env python3
"""Per-decode-step kernel time breakdown from `ncu --metrics gpu__time_duration.sum --csv` output
(scripts/profile-decode.sh writes ncu-times.csv). The last decode step is the last occurrence of
the step's first kernel name (default: the embedding kernel) to the end of the log.
Usage: scripts/ncu-step-table.py ncu-times.csv [--first embed_kernel] [--steps 2]"""
import csv, re, sys, argparse, collections

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--first", default="embed_kernel", help="name prefix of a step's first kernel")
ap.add_argument("--steps", type=int, default=1, help="average over the last N steps")
a = ap.parse_args()

rows = []
with open(a.csv, newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = re.sub(r"\(.*", "", r["Kernel Name"]).replace("void ", "").strip()
    name = re.sub(r"^nf4flash::(cuda::)?", "", name)  # kernels live in both namespaces
    unit = r.get("Metric Unit", "ns")
    v = float(r["Metric Value"].replace(",", ""))
    us = v / 1000.0 if unit in ("nsecond", "ns") else (v if unit in ("usecond", "us") else v * 1000.0)
    rows.append((name, us))
starts = [i for i, (n, _) in enumerate(rows) if n.startswith(a.first)]
if len(starts) < a.steps:
    sys.exit(f"fewer than {a.steps} steps starting with {a.first}")
sel = starts[-a.steps:] + [len(rows)]
per = collections.defaultdict(lambda: [0, 0.0])
for s, e in zip(sel[:-1], sel[1:]):
    for n, us in rows[s:e]:
        per[n][0] += 1
        per[n][1] += us
tot = sum(v[1] for v in per.values()) / a.steps
print(f"{'kernel':<48} {'launches':>8} {'us/step':>10} {'share':>7}")
for n, (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    print(f"{n[:48]:<48} {c / a.steps:8.1f} {us / a.steps:10.1f} {100 * us / a.steps / tot:6.1f}%")
print(f"{'total (kernels back to back, ncu)':<48} {sum(v[0] for v in per.values()) / a.steps:8.1f} {tot:10.1f}")

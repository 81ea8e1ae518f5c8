#!/usr/bin/env python3
"""Summarize an ncu per-instruction source page (ncu -i REP --page source --print-source sass --csv).

Prints the warp-stall totals of the whole kernel, the straight-line blocks (runs of consecutive
instructions with the same execution count) that issue the most instructions with their stall
samples and top reasons, and the opcode mix of the hottest block. With --tiles N (the 512-byte
tiles of a 4-bit GEMV launch) it also prints instructions per tile.

Usage: scripts/ncu-sass-summary.py FILE.csv[.gz] [--tiles N] [--blocks K]
"""
import argparse
import collections
import csv
import gzip
import sys


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"Address"')), None)
    if start is None:
        sys.exit(f"{path}: no source-page header (\"Address\",...) found")
    rows = list(csv.reader(lines[start:]))
    head = rows[0]
    return head, [r for r in rows[1:] if len(r) == len(head)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--tiles", type=float, default=0, help="512-byte tiles of the launch (instructions per tile)")
    ap.add_argument("--blocks", type=int, default=12, help="blocks to list")
    a = ap.parse_args()
    head, rows = read_rows(a.csv)
    ix = {n: k for k, n in enumerate(head)}

    def num(r, name):
        try:
            return float(r[ix[name]] or 0)
        except (KeyError, ValueError):
            return 0.0

    stalls = [n for n in head if n.startswith("stall_") and "Not Issued" not in n]
    exe, samp = "Instructions Executed", "Warp Stall Sampling (All Samples)"
    total_i = sum(num(r, exe) for r in rows)
    total_s = sum(num(r, samp) for r in rows) or 1.0
    print(f"instructions {total_i:.0f}, stall samples {total_s:.0f}"
          + (f", {total_i / a.tiles:.1f} instructions per tile" if a.tiles else ""))
    tot = {n: sum(num(r, n) for r in rows) for n in stalls}
    print("stall reasons: " + ", ".join(f"{n[6:]} {v / total_s * 100:.1f}%"
                                        for n, v in sorted(tot.items(), key=lambda x: -x[1]) if v > 0))
    # straight-line blocks: consecutive rows with one execution count
    blocks = []
    for k, r in enumerate(rows):
        e = num(r, exe)
        if blocks and blocks[-1]["exec"] == e and blocks[-1]["end"] == k - 1:
            blocks[-1]["end"] = k
        else:
            blocks.append({"start": k, "end": k, "exec": e})
    for b in blocks:
        rs = rows[b["start"]:b["end"] + 1]
        b["n"] = len(rs)
        b["instr"] = b["exec"] * len(rs)
        b["samples"] = sum(num(r, samp) for r in rs)
        b["why"] = collections.Counter({n[6:]: sum(num(r, n) for r in rs) for n in stalls})
    hot = sorted(blocks, key=lambda b: -b["instr"])[: a.blocks]
    print(f"{'rows':>11} {'n':>4} {'exec':>7} {'instr%':>7} {'samples%':>8}  top stalls")
    for b in hot:
        why = ", ".join(f"{k} {v:.0f}" for k, v in b["why"].most_common(3) if v > 0)
        print(f"{b['start']:>5}-{b['end']:<5} {b['n']:>4} {b['exec']:>7.0f} {b['instr'] / total_i * 100:>6.1f}% "
              f"{b['samples'] / total_s * 100:>7.1f}%  {why}")
    if hot:
        b = hot[0]
        ops = collections.Counter()
        for r in rows[b["start"]:b["end"] + 1]:
            src = r[ix["Source"]].split()
            if src and src[0].startswith("@"):
                src = src[1:]
            if src:
                ops[src[0]] += 1
        print(f"opcode mix of rows {b['start']}-{b['end']}: " + ", ".join(f"{o} {c}" for o, c in ops.most_common(16)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Tables from a kernel-bench JSON (nf4flash kernel-bench --json): the read-order rows ("read units")
and the read-only rows as they are, the T=1 4-bit GEMV rows ("gemv nf4-dq RxK T=1 <variant>": the
default, grouped layout, speed-of-light ablations) one line per shape with a column per variant,
and the decode attention rows ("attn decode ctx=N <variant> (...)") one line per context with a
column per variant (us, and % of copy with --pct).

  scripts/kb-table.py build-gpu/out/attn/kb-attn.json [--pct]
"""
import argparse
import json
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--pct", action="store_true", help="percent of copy instead of microseconds")
    a = ap.parse_args()
    d = json.load(open(a.json))
    rows = d.get("kernels", [])
    copy = d.get("copy", {}).get("gb_per_s")
    if copy:
        print(f"copy {copy:.0f} GB/s ({d.get('gpu', '?')})")
    reads = [r for r in rows if r["name"].startswith("read units")]
    if reads:
        print(f"\n{'read units':<78} {'us':>8} {'%copy':>6}")
        for r in reads:
            print(f"{r['name']:<78} {r['us']:8.2f} {r['pct_of_copy']:6.1f}")
    ro = [r for r in rows if r["name"].startswith("read-only")]
    for r in ro:
        print(f"{r['name']:<78} {r['us']:8.2f} {r['pct_of_copy']:6.1f}")
    gpat = re.compile(r"^gemv nf4-dq (\d+x\d+) T=1 (seq|seq grouped|grouped|ablate-[a-z]+)$")
    gemv, gvars = {}, []
    for r in rows:
        m = gpat.match(r["name"])
        if m:
            v = "grouped" if m.group(2) == "seq grouped" else m.group(2)
            if v not in gvars:
                gvars.append(v)
            gemv.setdefault(m.group(1), {})[v] = r["pct_of_copy"] if a.pct else r["us"]
    if gemv:
        w = max(10, max(len(v) for v in gvars) + 1)
        print(f"\n{'gemv nf4-dq T=1':<16}" + " ".join(f"{v:>{w}}" for v in gvars) + ("   (% of copy)" if a.pct else "   (us)"))
        for shape, cells in gemv.items():
            print(f"{shape:<16}" + " ".join(f"{cells[v]:>{w}.2f}" if v in cells else f"{'-':>{w}}" for v in gvars))
    pat = re.compile(r"^attn decode ctx=(\d+) (.+?) \(32/8, hd128(?:, (\d+) layers)?\)$")
    table, variants = {}, []
    for r in rows:
        m = pat.match(r["name"])
        if not m:
            continue
        ctx, v = int(m.group(1)), m.group(2)
        if v not in variants:
            variants.append(v)
        table.setdefault(ctx, {})[v] = r["pct_of_copy"] if a.pct else r["us"]
    if table:
        w = max(10, max(len(v) for v in variants) + 1)
        print(f"\n{'ctx':>6} " + " ".join(f"{v:>{w}}" for v in variants) + ("   (% of copy)" if a.pct else "   (us)"))
        for ctx in sorted(table):
            cells = [table[ctx].get(v) for v in variants]
            print(f"{ctx:>6} " + " ".join(f"{c:>{w}.2f}" if c is not None else f"{'-':>{w}}" for c in cells))
    if not reads and not table and not gemv and not ro:
        print("no read-units, read-only, gemv or decode attention rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

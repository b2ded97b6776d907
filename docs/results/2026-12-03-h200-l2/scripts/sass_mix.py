"""Instruction mix and stall samples of an ncu source export (``ncu --import R --page source --csv
--print-source sass``): executed warp instructions by opcode, the stall samples by reason, and the same for the
hottest loop (the instructions executed at least ``--hot`` x the most executed one's count / 2).

    python sass_mix.py A-sass.csv[.gz] [B-sass.csv.gz ...] [--top 25]
"""
import argparse
import csv
import gzip
from collections import Counter


def read(path):
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        rows = list(csv.reader(f))
    header = rows[1]
    out = []
    for row in rows[2:]:
        if len(row) != len(header):
            continue
        rec = dict(zip(header, row))
        rec["executed"] = int(rec["Instructions Executed"].replace(",", "") or 0)
        rec["samples"] = int(rec["Warp Stall Sampling (All Samples)"].replace(",", "") or 0)
        source = rec["Source"].strip()
        if source.startswith("@"):  # predicate
            source = source.split(None, 1)[1] if " " in source else source
        rec["opcode"] = source.split()[0].split(".")[0] if source else "?"
        out.append(rec)
    return out, [h for h in header if h.startswith("stall_") and "Not Issued" not in h]


def summarize(path, top, hot_fraction):
    recs, stalls = read(path)
    total = sum(r["executed"] for r in recs)
    samples = sum(r["samples"] for r in recs)
    print(f"== {path}: {total:,} warp instructions, {samples:,} stall samples")
    peak = max(r["executed"] for r in recs)
    hot = [r for r in recs if r["executed"] >= hot_fraction * peak]
    for name, part in (("whole kernel", recs), (f"hot (>= {hot_fraction:g} x the peak count {peak:,})", hot)):
        ex = Counter()
        for r in part:
            ex[r["opcode"]] += r["executed"]
        n = sum(ex.values())
        print(f"-- {name}: {len(part)} SASS lines, {n:,} executed ({n / total:.1%})")
        print("   " + ", ".join(f"{op} {c / n:.1%}" for op, c in ex.most_common(top)))
        st = Counter()
        for r in part:
            for s in stalls:
                st[s] += int(r[s].replace(",", "") or 0)
        m = sum(st.values()) or 1
        print("   stalls: " + ", ".join(f"{s[6:]} {c / m:.1%}" for s, c in st.most_common(8)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--hot", type=float, default=0.5)
    args = parser.parse_args()
    for path in args.paths:
        summarize(path, args.top, args.hot)

"""One line per (variant round, cell): the fused rows of bench_mixed's mixed.csv files under a folder (µs)."""
import csv
import glob
import os
import sys

root = sys.argv[1]
for path in sorted(glob.glob(os.path.join(root, "*", "mixed.csv"))):
    variant = os.path.basename(os.path.dirname(path))
    with open(path) as handle:
        for row in csv.DictReader(handle):
            if row.get("provider") == "fused":
                print(f"{variant:10} {row['cell'][:60]:60} {row.get('us', '')[:8]:>8} {row.get('status', '')}")

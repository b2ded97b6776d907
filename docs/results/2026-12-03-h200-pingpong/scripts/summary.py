"""pingpong_ab.py's logs -> per cell: free issue and ping-pong µs (each round's, then the means) and their ratio.

    python3 docs/results/2026-12-03-h200-pingpong/scripts/summary.py docs/results/2026-12-03-h200-pingpong/out/call1/ab.log
"""
import re
import sys
from collections import defaultdict

times = defaultdict(list)
for path in sys.argv[1:]:
    for line in open(path):
        match = re.match(r"round \d+ pingpong=(\d) (.+?)\s+([\d.]+)$", line.strip())
        if match:
            times[match[2], match[1]].append(float(match[3]))
for cell in dict.fromkeys(name for name, _ in times):
    free, turns = times[cell, "0"], times[cell, "1"]
    mean_free, mean_turns = sum(free) / len(free), sum(turns) / len(turns)
    print(f"| {cell} | {' / '.join(f'{t:,.1f}' for t in free)} | {' / '.join(f'{t:,.1f}' for t in turns)} "
          f"| {mean_free:,.1f} -> {mean_turns:,.1f} | {mean_turns / mean_free:.3f} |")

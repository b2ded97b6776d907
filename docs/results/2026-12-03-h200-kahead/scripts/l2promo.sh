#!/usr/bin/env bash
# Forty-third session, call 3: TMA descriptors re-encoded with another L2 promotion (ATTN_TMA_L2_PROMOTION,
# attention/kernels/tma_promotion.py) against Triton's 128 B, in one env_ab process (variants alternated by round;
# each variant's output compared with the default's).
# Usage: bash l2promo.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $OUT/gpu.txt
timeout 560 python3 -m benchmarks.env_ab --cells "64x4k p16,128x2k p16,32x32k p16,64x4k MHA,1x8k p16,M2 part: prefill,M2 2k chunk" \
  --rounds 3 --variant l2-256=ATTN_TMA_L2_PROMOTION=256 --variant l2-none=ATTN_TMA_L2_PROMOTION=none --out $OUT/l2promo
# the setting takes effect: maps re-encoded in one decode cell's calls (and its output against Triton's maps)
ATTN_TMA_L2_PROMOTION=256 timeout 120 python3 - <<'PY' 2>&1 | tail -3
import torch
from benchmarks.cells import Inputs
from benchmarks.config import BenchConfig
from benchmarks.providers import make_fused
from benchmarks.suites import wanted_cells
import argparse, os
from benchmarks.config import add_common_arguments, config_from_args
name = os.environ.get("CELL", "64x4k p16")
parser = argparse.ArgumentParser(); add_common_arguments(parser, 60)
cfg = config_from_args(parser.parse_args(["--cells", name] + (["--smoke"] if os.environ.get("SMOKE") else [])))
cell = [c for c in wanted_cells(cfg) if c.name == name][0]
runner, reason = make_fused(cell, Inputs(cell.problem, cfg.device, cfg.seed, cell.page_order))
from attention.kernels import tma_promotion
with torch.no_grad():
    outs = [runner.to_thd(runner.fn()).float() for _ in range(3)]
torch.cuda.synchronize() if torch.cuda.is_available() else None
print("re-encoded maps:", tma_promotion.reencoded, "max diff call 1 vs 3:", (outs[0] - outs[2]).abs().max().item())
PY

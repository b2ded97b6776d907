#!/usr/bin/env bash
# The program order's section budget swept (working tree with HOPPER_L2_SECTION_MIB = 8): env_ab, the default (8 MiB)
# against 0 (one KV head a section, the order before), 4, 16 and 32 MiB, three rounds, on the cells where call 5 moved.
# Usage: bash sections2.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 330 python3 -m benchmarks.env_ab --rounds 3 --quiet --out $OUT/sections2 \
  --cells "M1 part: prefill,M2 part: prefill,GQA 32/8 causal 1x16k,GQA 32/8 causal 4x4k,MHA causal 1x16k,MHA full 4x4k" \
  --variant "kvhead=ATTN_FUSED_HOPPER_L2_SECTION=0" --variant "4mib=ATTN_FUSED_HOPPER_L2_SECTION=4" \
  --variant "16mib=ATTN_FUSED_HOPPER_L2_SECTION=16" --variant "32mib=ATTN_FUSED_HOPPER_L2_SECTION=32"

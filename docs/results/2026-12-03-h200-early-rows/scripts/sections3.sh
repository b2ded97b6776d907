#!/usr/bin/env bash
# Sections for causal calls only (8 MiB), one KV head a section without a mask: env_ab, the default against 0 (one KV
# head a section for every call, the order before), three rounds.
# Usage: bash sections3.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 250 python3 -m benchmarks.env_ab --rounds 3 --quiet --out $OUT/sections3 \
  --cells "M1 part: prefill,M2 part: prefill,GQA 32/8 causal 1x16k,GQA 32/8 causal 4x4k,GQA 32/8 causal 16x1k,MHA causal 1x16k,MHA causal 4x4k,MHA full 4x4k,d64 MHA 32 causal" \
  --variant "kvhead=ATTN_FUSED_HOPPER_L2_SECTION=0"

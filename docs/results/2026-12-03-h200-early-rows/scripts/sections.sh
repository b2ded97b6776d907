#!/usr/bin/env bash
# The prefill kernel's program order in L2 sections (HOPPER_L2_SECTION_MIB, in the working tree): the Hopper GPU
# tests, then env_ab on prefill cells: the default (sections of KV heads whose K/V fit 32 MiB, the longest causal
# walks first within a section) against one KV head a section (the order before, ATTN_FUSED_HOPPER_L2_SECTION=0)
# and every head in one section (=100000), three rounds.
# Usage: bash sections.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_gpu.py > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$?"; tail -3 $OUT/gpu-tests.log
timeout 330 python3 -m benchmarks.env_ab --rounds 3 --quiet --out $OUT/sections \
  --cells "M1 part: prefill,M2 part: prefill,GQA 32/8 causal 1x16k,GQA 32/8 causal 4x4k,GQA 32/8 causal 16x1k,MHA causal 1x16k,MHA full 4x4k,chunk 2k on 30k p16,d64 MHA 32 causal" \
  --variant "kvhead=ATTN_FUSED_HOPPER_L2_SECTION=0" --variant "all=ATTN_FUSED_HOPPER_L2_SECTION=100000"

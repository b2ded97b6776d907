#!/usr/bin/env bash
# The seventy-third session's device calls (repository root; $OUT), chained inside the warm window:
#   ab       carry [".device/fa4-a"]: the GPU; flash-attn-4's first part staged; the L2-promotion experiment
#            (attention/kernels/tma_promotion.py, env-driven, unset = Triton's 128 B): check_promotion.py (each setting
#            re-encodes what it names, outputs unchanged), then env_ab on the decode cells that miss (decode
#            descriptors with no promotion / 64 B; the decode tile 64,2,2,128 on 32x2k) and on M1 / M2 (prefill
#            descriptors 256 B / none), rounds alternating in one process                                     ~400 s
#   check    carry [".device/fa4-a"]: as ab's first part, the check only
#   two      carry [".device/fa4-b"]: the second part
#   targets  carry [".device/fa4-c"]: flash-attn-4 installed, every target read again (bench_mixed, bench_decode,
#            the targets table, host_ab pinned; needs BENCH_COMMIT): the first bench run after the harness's audit
#            fixes (a753d6a, 392d390)                                                                         ~590 s
#   flash    (after targets) tests/gpu/test_flash_gpu.py and tests/test_flash_backend.py with flash-attn-4 installed
#            (the adapter's device guard as refactored in 4c5103b)                                           ~130 s
# Usage: BENCH_COMMIT=<hash> bash docs/results/2026-12-06-h200-s73/scripts/calls.sh STEP ...
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OMP_NUM_THREADS=1
here=docs/results/2026-12-06-h200-s73/scripts
last=docs/results/2026-12-05-h100-44f1237/scripts/session.sh
for step in "$@"; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    ab)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
      bash scripts/stage_flash_attn4.sh a
      timeout 120 python3 $here/check_promotion.py 2>&1 | grep -v Warn | tee $OUT/check-promotion.txt
      timeout 280 python3 -m benchmarks.env_ab --rounds 4 --quiet --out $OUT/decode \
        --cells "64x4k p16,32x32k p16,MHA 32/32 p16,32x2k p16,128x2k p16" \
        --variant "dnone=ATTN_TMA_DECODE_L2_PROMOTION=none" --variant "d64=ATTN_TMA_DECODE_L2_PROMOTION=64" \
        --variant "t2=ATTN_FUSED_HOPPER_DECODE_TILE=64,2,2,128" > $OUT/decode.log 2>&1
      echo "decode env_ab rc=$?"; tail -n 40 $OUT/decode/env_ab.md
      timeout 240 python3 -m benchmarks.env_ab --rounds 4 --quiet --out $OUT/mixed \
        --cells "M2 2k chunk,M2 part: prefill,M2 probe,M1 2k prefill" \
        --variant "p256=ATTN_TMA_PREFILL_L2_PROMOTION=256" --variant "pnone=ATTN_TMA_PREFILL_L2_PROMOTION=none" \
        --variant "dnone=ATTN_TMA_DECODE_L2_PROMOTION=none" > $OUT/mixed.log 2>&1
      echo "mixed env_ab rc=$?"; tail -n 40 $OUT/mixed/env_ab.md ;;
    check)   # carry [".device/fa4-a"]: the promotion check alone (its first form failed on its own arguments)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
      bash scripts/stage_flash_attn4.sh a
      timeout 120 python3 $here/check_promotion.py 2>&1 | grep -v Warn | tee $OUT/check-promotion.txt ;;
    two) bash $last stage-b ;;
    targets) bash $last install targets ;;
    flash)
      timeout 300 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_flash_gpu.py tests/test_flash_backend.py \
        > $OUT/flash.log 2>&1
      echo "flash rc=$?"; tail -n 1 $OUT/flash.log; grep -E "^(FAILED|ERROR)" $OUT/flash.log | head -20 ;;
    fixes)   # the test fixes of this session on a CUDA host (no flash-attn needed): the memory fixture's teardown
             # after CPU tests that patch torch.cuda.device, the import check in a fresh interpreter; then, on an
             # H200 only, the promotion A/B on M2 / M1 and the decode cells again (the first ab ran on an H100)
      nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
      timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_flash_backend.py tests/test_launch.py \
        tests/test_tma_promotion.py > $OUT/fixes.log 2>&1
      echo "fixes rc=$?"; tail -n 1 $OUT/fixes.log; grep -E "^(FAILED|ERROR)" $OUT/fixes.log | head -20
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        timeout 240 python3 -m benchmarks.env_ab --rounds 6 --quiet --out $OUT/mixed \
          --cells "M2 2k chunk,M2 part: prefill,M2 probe" \
          --variant "p256=ATTN_TMA_PREFILL_L2_PROMOTION=256" --variant "pnone=ATTN_TMA_PREFILL_L2_PROMOTION=none" \
          > $OUT/mixed.log 2>&1
        echo "mixed env_ab rc=$?"; tail -n 14 $OUT/mixed/env_ab.md
        timeout 200 python3 -m benchmarks.env_ab --rounds 4 --quiet --out $OUT/decode \
          --cells "64x4k p16,32x32k p16,MHA 32/32 p16,32x2k p16" \
          --variant "dnone=ATTN_TMA_DECODE_L2_PROMOTION=none" --variant "t2=ATTN_FUSED_HOPPER_DECODE_TILE=64,2,2,128" \
          > $OUT/decode.log 2>&1
        echo "decode env_ab rc=$?"; tail -n 40 $OUT/decode/env_ab.md
      fi ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done

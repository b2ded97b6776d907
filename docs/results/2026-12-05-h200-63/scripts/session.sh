#!/usr/bin/env bash
# Sixty-third session's device calls (prepared before the lease; calls chained inside the warm window).
#   suite    the whole GPU suite (scripts/gpu_tests.sh, T=450, logs in $OUT/gpu-logs), with the captured sbhd / thd /
#            mixed steps of tests/test_decode_graph.py and tests/test_cache_step_features.py on the GPU; ~450 s
#   stage-a / stage-b  the first two parts of flash-attn-4's wheel to /tmp/fa4w (carry .device/fa4-a, then fa4-b)
#   flash    with .device/fa4-c carried: flash-attn-4 installed, then tests/gpu/test_flash_gpu.py whole (the
#            module's gradients against the fp32 reference on the real package included) and flash-attn-4's part
#            of the GPU grid for what time is left (GRID_S); logs in $OUT
# Usage (repository root; $OUT): bash session.sh STEP [STEP ...]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
for step in "$@"; do
  echo "== $step $(date -u +%H:%M:%S)"
  case $step in
    suite) T=${T:-450} bash scripts/gpu_tests.sh $OUT/gpu-logs; echo "gpu suite rc=$?"
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader ;;
    stage-a) mkdir -p /tmp/fa4w && cp .device/fa4-a/* /tmp/fa4w/ && ls /tmp/fa4w | wc -l ;;
    stage-b) cp .device/fa4-b/* /tmp/fa4w/ && ls /tmp/fa4w | wc -l ;;
    flash)
      cp .device/fa4-c/* /tmp/fa4w/ && cat /tmp/fa4w/cu13.part.a? > "/tmp/fa4w/$(cat /tmp/fa4w/big-wheel-name)" \
        && rm /tmp/fa4w/cu13.part.a? && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        /tmp/fa4w/*.whl && python3 -c "import flash_attn.cute" && echo "flash-attn-4 installed" \
        || { echo "flash-attn-4 did not install"; exit 1; }
      python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
      timeout ${TESTS_S:-400} python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_flash_gpu.py \
        > $OUT/flash_gpu.log 2>&1; echo "flash gpu rc=$?"; grep -E "passed|failed|FAILED|Error" $OUT/flash_gpu.log | tail -25
      timeout ${GRID_S:-150} python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/gpu/test_attention_grid_gpu.py \
        -k flash4 > $OUT/flash4_grid.log 2>&1; echo "flash4 grid rc=$? (124: stopped at its limit)"
      grep -cE "PASSED|passed" $OUT/flash4_grid.log; tail -3 $OUT/flash4_grid.log ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done

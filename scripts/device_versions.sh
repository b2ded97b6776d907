#!/usr/bin/env bash
# What a device run ran on, for its record: the GPU (name, driver, memory, max SM clock, power limit), torch and
# triton, the flash-attn packages and CuTe DSL installed, the cores, and the commit BENCH_COMMIT names.
# Usage (on the device): BENCH_COMMIT=<hash> bash scripts/device_versions.sh > versions.txt
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m pip list 2>/dev/null | grep -iE "^(flash|nvidia-cutlass)"
echo "cores $(nproc), commit ${BENCH_COMMIT:-unknown}"

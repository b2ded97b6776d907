#!/usr/bin/env bash
# flash-attn 2 for the lent GPU, built here where no GPU is needed: the device's Python 3.12 and torch 2.11.0+cu130
# (PyPI's torch 2.11.0 is that build), this machine's nvcc 13.0, sm90 only, forward only (the kernels the benchmarks
# and the flash backend call): 55 minutes on 2 cores here (2026-12-07; a rerun reuses the objects: seconds), where
# the device took ~13 minutes of a lease. The wheel: about 40 MB, its extension needing GLIBC 2.32 at most.
# The wheel is then split in two parts, .device/fa2-a and .device/fa2-b, which `scripts/stage_flash_attn.sh 2 a` and
# `2 install` carry and install there in two calls (before flash-attn-4: its wheel ships an old flash_attn/cute).
# Needs .device/fa2/flash_attn-2.8.3.post2.tar.gz (`bash ../shared/device/flash_attn.sh prepare`), a Python 3.12
# (PYTHON312, default pyenv's 3.12.1), nvcc 13.0 (CUDA_HOME, default /usr/local/cuda-13.0). Work folders in /tmp:
# a second run reuses the venv and the compiled objects.
# Usage (repository root): bash scripts/build_flash_attn2.sh      (env MAX_JOBS, default the cores)
set -eu
cd "$(dirname "$0")/.."
python312=${PYTHON312:-/root/.pyenv/versions/3.12.1/bin/python}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda-13.0}
venv=/tmp/fa2venv src=/tmp/fa2src/flash_attn-2.8.3.post2 out=/tmp/fa2wheel
[ -x $venv/bin/python ] || {
  $python312 -m venv $venv
  $venv/bin/pip install -q torch==2.11.0 "setuptools<82" wheel ninja packaging psutil
}
$venv/bin/python -c "import torch; assert torch.version.cuda == '13.0', torch.__version__; print('torch', torch.__version__)"
[ -d $src ] || { mkdir -p /tmp/fa2src && tar xzf .device/fa2/flash_attn-2.8.3.post2.tar.gz -C /tmp/fa2src; }
start=$(date +%s)
( cd $src
  export PATH=$CUDA_HOME/bin:$PATH MAX_JOBS=${MAX_JOBS:-$(nproc)} NVCC_THREADS=1 FLASH_ATTENTION_FORCE_BUILD=TRUE
  export FLASH_ATTN_CUDA_ARCHS=90 NVCC_APPEND_FLAGS="-DFLASHATTENTION_DISABLE_BACKWARD -DFLASHATTENTION_DISABLE_DROPOUT"
  # nvcc's flags reach the .cu files only; flash_api.cpp (the host compiler's) needs the macro as well, or its bwd
  # launches nothing and returns gradients never written (2026-12-07, an H100: dq off by 3.7) instead of refusing
  export CFLAGS="-DFLASHATTENTION_DISABLE_BACKWARD"
  $venv/bin/python -m pip wheel -q --no-build-isolation --no-deps --no-index -w $out . )
wheel=$(ls $out/flash_attn-*.whl)
echo "built $wheel in $(( $(date +%s) - start )) s, $(du -m "$wheel" | cut -f1) MB"
rm -rf .device/fa2-a .device/fa2-b && mkdir -p .device/fa2-a .device/fa2-b
basename "$wheel" > .device/fa2-a/big-wheel-name
split -n 2 "$wheel" /tmp/fa2.part. && mv /tmp/fa2.part.aa .device/fa2-a/ && mv /tmp/fa2.part.ab .device/fa2-b/
du -sh .device/fa2-a .device/fa2-b

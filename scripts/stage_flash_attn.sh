#!/usr/bin/env bash
# A flash-attn on the device from wheels split over several carries: a call carries at most 64 MiB with the tracked
# tree (26 MB on 2026-12-07), so a wheel of 40 MB and more travels in parts, one carry a call, the calls chained
# within the machine's warm window (the parts wait in /tmp/fa<VERSION>w between them).
#   flash-attn-4  (`bash scripts/h200_lease.sh prepare`: .device/fa4-a, -b, -c)      4 a, 4 b, 4 install (carries -c)
#   flash-attn 2  (`bash scripts/build_flash_attn2.sh` here: .device/fa2-a, -b)       2 a, 2 install (carries -b)
# `install` joins the parts, installs every wheel staged (no index, no dependencies) and imports the package;
# `check` imports it alone (no carry), e.g. after another install could have overwritten its files.
# flash-attn 2's wheel ships an old flash_attn/cute: install it before flash-attn-4, whose interface it overwrites.
# Usage (repository root, on the device): bash scripts/stage_flash_attn.sh 2|4 a|b|install|check
set -eu
version=${1:-} step=${2:-}
ready() {
  if [ "$version" = 4 ]; then
    python3 -c "import flash_attn.cute as c; print('flash-attn-4 ready:', c.flash_attn_varlen_func.__name__)"
  else
    python3 -c "import torch, flash_attn, flash_attn_2_cuda; print('flash-attn 2 ready:', flash_attn.__version__)"
  fi
}
case "$version:$step" in
  4:a | 4:b | 2:a) carry=.device/fa$version-$step ;;
  4:install) carry=.device/fa4-c ;;
  2:install) carry=.device/fa2-b ;;
  2:check | 4:check) ready; exit ;;
  *) sed -n 2,10p "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
W=/tmp/fa${version}w
mkdir -p $W && cp $carry/* $W/
if [ "$step" = install ]; then
  cat $W/*.part.a? > "$W/$(cat $W/big-wheel-name)" && rm $W/*.part.a?
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir $W/*.whl 2>&1 | tail -3
  ready
fi
echo "stage_flash_attn $version $step: $(ls $W | wc -l) files in $W"

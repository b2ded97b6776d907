#!/usr/bin/env bash
# flash-attn-4 on the device, from the three carries `bash scripts/h200_lease.sh prepare` makes here: a call
# carries at most 64 MiB beside the tracked tree, so the ~90 MB wheel travels in three calls chained within the
# machine's warm window (the parts wait in /tmp/fa4w between them).
#   a        carry [".device/fa4-a"]: the wheel's first part (and its name) to /tmp/fa4w
#   b        carry [".device/fa4-b"]: the second part
#   install  carry [".device/fa4-c"]: the last part and the small wheels; the wheel joined and everything installed
#            (no index, no dependencies), then `import flash_attn.cute` checked
# Usage (repository root, on the device): bash scripts/stage_flash_attn4.sh a|b|install
set -eu
W=/tmp/fa4w
case "${1:-}" in
  a) mkdir -p $W && cp .device/fa4-a/* $W/ ;;
  b) cp .device/fa4-b/* $W/ ;;
  install)
    cp .device/fa4-c/* $W/
    cat $W/cu13.part.a? > "$W/$(cat $W/big-wheel-name)" && rm $W/cu13.part.a?
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir $W/*.whl 2>&1 | tail -3
    python3 -c "import flash_attn.cute as c; print('flash-attn-4 ready:', c.flash_attn_varlen_func.__name__)" ;;
  *) sed -n 2,9p "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
echo "stage_flash_attn4 $1: $(ls $W | wc -l) files in $W"

#!/usr/bin/env bash
# The GPU test suite in parallel shards: Triton compiles are CPU-bound, so on a 16-core GPU host
# fifteen pytest processes at once finish in 5-7 minutes where one takes far longer.
# Usage: scripts/gpu_tests.sh [LOG_DIR]   (env T = per-shard time limit in seconds, default 600;
#        env SHARDS = the shards to run, by name, e.g. SHARDS="cache-compile grid-a"; default all)
set -u
case ${1:-} in
  -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "gpu_tests.sh: unknown option $1 (usage: scripts/gpu_tests.sh [LOG_DIR])" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # 15 shards x 16 threads stall CPU-side work
logs=${1:-gpu-test-logs}
mkdir -p "$logs"
rm -f "$logs"/*.log   # a reused folder's old logs would count below
T=${T:-600}
grid=tests/gpu/test_attention_grid_gpu.py
shard() {
  local name=$1; shift
  case " ${SHARDS:-$name} " in *" $name "*) ;; *) return ;; esac
  ( timeout "$T" python3 -m pytest -q -p no:cacheprovider "$@" > "$logs/$name.log" 2>&1
    echo "rc=$?" >> "$logs/$name.log" ) &
}
for name in ${SHARDS:-}; do   # a misspelt name would run nothing, silently
  grep -q "^shard $name " scripts/gpu_tests.sh || { echo "gpu_tests.sh: no shard named $name" >&2; exit 2; }
done
shard kernels-a -m gpu tests/gpu/test_kernels_gpu.py -k "paged or ragged or fuzz or graph or split"
shard kernels-b -m gpu tests/gpu/test_kernels_gpu.py -k "not (paged or ragged or fuzz or graph or split)"
shard variants -m gpu tests/gpu/test_variants_gpu.py
shard hopper -m gpu tests/gpu/test_hopper_gpu.py
# (hopper-decode and hopper-mixed were one shard, the suite's longest: 336 s on an H100 host, past 440 s alone on a
# slower one; hopper-mixed alone then ran 91 of its 106 tests in 420 s beside the others, H100, 2026-12-06)
shard hopper-decode -m gpu tests/gpu/test_hopper_decode_gpu.py
shard hopper-mixed -m gpu tests/gpu/test_hopper_mixed_gpu.py tests/gpu/test_hopper_direct_launch_gpu.py \
  -k "not matches_the_reference"
shard hopper-mixed-reference -m gpu tests/gpu/test_hopper_mixed_gpu.py -k "matches_the_reference"
shard hopper-mixed-roles -m gpu tests/gpu/test_hopper_mixed_roles_gpu.py
shard grid-a -m gpu "$grid" -k "fused and (masks_heads or padding_masks or automatic)"
shard grid-b -m gpu "$grid" -k "fused and (head_dims or softmax)"
shard grid-c -m gpu "$grid" -k "fused and (sliding or alibi)"
shard grid-d -m gpu "$grid" -k "not fused or bias or arbitrary or training"
shard cache-compile tests/gpu/test_kv_append_gpu.py tests/gpu/test_serving_gpu.py tests/test_serving_simulation.py tests/test_compile.py tests/test_decode_graph.py \
  tests/test_cache_step_features.py tests/test_scrambled_pages.py \
  tests/test_seqlens_check.py tests/gpu/test_input_layouts_gpu.py
shard other-device -m gpu tests/gpu/test_other_device_gpu.py   # skips its cases unless the host has two GPUs
shard flash tests/gpu/test_flash_gpu.py   # its own: with flash-attn-4 installed it ran past 430 s beside the above
wait
status=0
for f in "$logs"/*.log; do
  echo "== $f: $(grep -E '(passed|failed|error)' "$f" | tail -1)"
  grep -q '^rc=0$' "$f" || status=1
done
exit $status

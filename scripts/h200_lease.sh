#!/bin/bash
# One lease on the lent H200: the config sweep, the GPU suite with flash-attn 2 and flash-attn-4
# installed, the side-by-side benchmarks and the host-overhead suite, in five `run` calls sent back
# to back (the machine stays warm only ~30 s between calls; about 27 minutes held).
#
# Here, once per checkout:  bash scripts/h200_lease.sh prepare      (downloads into .device/, ignored)
# flash-attn 2 has no wheel for this torch: `bash scripts/build_flash_attn2.sh` builds it here (no GPU needed) into
# .device/fa2-a and .device/fa2-b, two parts of its wheel.
# Then five device calls, each `COMMIT=<hash> bash scripts/h200_lease.sh callN` (the hash written here: the
# device copy's .git may be stale, benchmarks/README.md):
#   call0  carry [".device/fa2-a"]      first half of flash-attn 2 staged                   seconds
#   call1  carry [".device/fa2-b"]      flash-attn 2 installed; the layout-variant sweep picks
#          ATTN_FUSED_VARIANTS (the GPU to itself); where an eager call's host time goes; with
#          SWEEP_CELLS="M1,1x8k" also tiles and split counts on those cells (TILE_BUDGET s) ~4-10 min
#   call2  carry [".device/fa4-a"]      first third of flash-attn-4 staged; the GPU suite (flash-attn 2
#          cases included); host-overhead suite                                           ~4 min
#   call3  carry [".device/fa4-b"]      second third of flash-attn-4 staged                 seconds
#   call4  carry [".device/fa4-c"]      flash-attn-4 installed; its tests, serving simulation and share of
#          the cross-backend grid; then benchmarks decode, mixed, prefill with call1's variants  ~8 min
#   call4-bench  carry [".device/fa4-c"]  instead of call4 when flash-attn-4's tests need no re-run
# flash-attn-4 travels in three parts (`prepare` splits its 92 MB wheel in 34 MiB parts, 36 / 36 / 21 MB, the small
# wheels with the last): a call carries at most 64 MiB with the tracked tree (18 MB on 2026-12-03, 24 MB on
# 2026-12-06, when 40 MB parts no longer fit beside it).
# SWEEP_ONLY / BENCH_ONLY (comma lists of decode, mixed, prefill) narrow the sweep and the benchmarks.
# Each call leaves $OUT/callN.tar.gz (all logs and reports so far).
# Where flash-attn 2 cannot be built here: ../shared/device/flash_attn.sh builds it on the device (fa2-start, then
# fa2-wait in a later call; ~13 min with the cores to itself, past 20 min beside the test shards on 2026-12-07). It
# must finish before flash-attn-4 is installed (its build writes a flash_attn/cute of its own). Its backward returns
# unwritten gradients instead of refusing (the macro in nvcc's flags only); flash2 sees no backward kernel in that
# extension and refuses training calls (attention/backends/flash_probe.py, v2_without_backward).
# Every pytest process runs with one OpenMP thread: eight shards of 16 threads each on 16 cores
# stalled the serving simulations (2026-11-30: >150 s per test; 7-13 s with OMP_NUM_THREADS=1).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 OMP_NUM_THREADS=1
export BENCH_COMMIT=${COMMIT:-unknown}
L=/tmp/lease; mkdir -p $L
stamp() { echo "[$(date +%T)] $*" | tee -a $L/timeline.txt; }
shards() {  # shards NAME N SECONDS pytest-args... : the collected tests split round-robin over N processes
  local name=$1 n=$2 t=$3; shift 3
  python3 -m pytest --collect-only -q -p no:cacheprovider "$@" 2>/dev/null | grep '::' > $L/$name.ids
  echo "$name: $(wc -l < $L/$name.ids) tests in $n shards"
  rm -f $L/$name.part.*; split -n r/$n $L/$name.ids $L/$name.part.
  for f in $L/$name.part.*; do
    ( timeout $t python3 -m pytest -q -p no:cacheprovider -rfEs $(cat $f) > $f.log 2>&1; echo "rc=$?" >> $f.log ) &
  done
  wait
  for f in $L/$name.part.*.log; do echo "  ${f##*/}: $(grep -E '[0-9]+ (passed|failed|skipped|error)' $f | tail -1) $(tail -1 $f)"; done
  cat $L/$name.part.*.log > $L/$name.log
}
pack() { tar czf $OUT/$1.tar.gz -C /tmp lease; }
environment() { bash scripts/device_versions.sh | tee $L/env.txt; }
sweep() {
  stamp "layout-variant sweep"
  timeout 430 python3 -m benchmarks.sweep --layout-only --only "${SWEEP_ONLY:-mixed,decode,prefill}" --compile-workers 12 \
    --out $L/sweep.md --variants-out $L/variants.txt \
    --budget-s 400 > $L/sweep.log 2>&1; echo "sweep rc=$?"; cat $L/variants.txt
  export ATTN_FUSED_VARIANTS=$(cat $L/variants.txt 2>/dev/null)
  timeout 50 python3 -m benchmarks.profile_call --out $L/profile.txt > $L/profile.log 2>&1; echo "profile rc=$?"
  if [ -n "${SWEEP_CELLS:-}" ]; then  # tiles and split counts (with the picked variants) on the cells named
    timeout $(( ${TILE_BUDGET:-150} + 20 )) python3 -m benchmarks.sweep --tiles-only --cells "$SWEEP_CELLS" \
      --compile-workers 12 --budget-s ${TILE_BUDGET:-150} --out $L/sweep-tiles.md > $L/sweep-tiles.log 2>&1
    echo "tile sweep rc=$?"
  fi
  stamp "sweep done"
}
install_fa4() {
  bash scripts/stage_flash_attn.sh 4 install
  bash scripts/device_versions.sh | tee -a $L/env.txt
}
bench() {
  bash scripts/stage_flash_attn.sh 2 check | tee -a $L/env.txt  # flash-attn-4's install may have overwritten files
  export ATTN_FUSED_VARIANTS=$(cat $L/variants.txt 2>/dev/null); echo "ATTN_FUSED_VARIANTS=$ATTN_FUSED_VARIANTS" | tee -a $L/env.txt
  timeout $(( 590 - SECONDS )) python3 -m benchmarks.run_all --out $L/bench --isolate --only "${BENCH_ONLY:-decode,mixed,prefill}" \
    --budget-s $(( 590 - SECONDS - 60 )) > $L/bench.log 2>&1
  echo "run_all rc=$?"; tail -3 $L/bench.log
  stamp "benchmarks done"
}
case "${1:-help}" in
prepare)  # the shared script's two parts, then three: 34 MiB parts of the big wheel, the last with the small wheels
  [ -d .device/fa4-c ] || {
    [ -d .device/fa4-a ] || PYTHON=${PYTHON:-.venv/bin/python} bash ../shared/device/flash_attn.sh prepare
    big=.device/$(cat .device/fa4-a/big-wheel-name) && mkdir -p .device/fa4-c && mv .device/fa4-a/*.whl .device/fa4-c/
    cat .device/fa4-a/cu13.part.aa .device/fa4-b/cu13.part.ab > "$big" && rm .device/fa4-[ab]/cu13.part.*
    split -b 34m "$big" .device/cu13.part. && rm "$big"
    [ ! -e .device/cu13.part.ad ] || { echo "prepare: the wheel needs more than three 34 MiB parts" >&2; exit 1; }
    mv .device/cu13.part.aa .device/fa4-a/ && mv .device/cu13.part.ab .device/fa4-b/ && mv .device/cu13.part.ac .device/fa4-c/
  }
  du -sh .device/*;;
call0)
  stamp call0; bash scripts/stage_flash_attn.sh 2 a;;
call1)
  stamp call1; environment
  bash scripts/stage_flash_attn.sh 2 install | tee -a $L/env.txt   # its import check names the version
  sweep; pack call1;;
call2)
  stamp call2
  bash scripts/stage_flash_attn.sh 4 a
  stamp "GPU suite (variants on as picked)"
  export ATTN_FUSED_VARIANTS=$(cat $L/variants.txt 2>/dev/null)
  T=${T:-290} bash scripts/gpu_tests.sh $L/gpu
  stamp "host-overhead suite"
  timeout 120 python3 -m benchmarks.run_all --out $L/overhead --only overhead > $L/overhead.log 2>&1; echo "overhead rc=$?"
  stamp "call2 done"; pack call2;;
call3)
  stamp call3; bash scripts/stage_flash_attn.sh 4 b;;
call4)
  stamp call4; install_fa4
  stamp "fa4 tests, serving simulation and share of the cross-backend grid"
  shards flash4 12 240 -m "gpu or not gpu" tests/gpu/test_flash_gpu.py tests/test_serving_simulation.py \
    tests/gpu/test_attention_grid_gpu.py -k "flash4 or cuda_graph"
  stamp "fa4 tests done"; pack call4; bench; pack call4;;
call4-bench)  # flash-attn-4 installed, then the benchmarks (when its tests need no re-run)
  stamp call4-bench; install_fa4; bench; pack call4-bench;;
*) sed -n '2,/^set -u/p' "$0" | sed '$d';;
esac

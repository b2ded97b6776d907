#!/usr/bin/env bash
# Does running flash-attn-4 in the same process (or just before) slow the fused kernel down?
#   interference.sh X : fa4 stage 1; fused alone (short and long warmup); the overhead suite
#   interference.sh Y : fa4 stage 2; fused with flash_attn.cute imported; fused after flash4 (short / long warmup); fused alone
# nvidia-smi samples clocks, power and throttle reasons every 50 ms into smi.csv.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
CELLS="MHA causal 4x4k,GQA 32/8 full 4x4k,GQA 32/8 causal 1x16k,MHA full 2x8k"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 50 > "$out/smi-$1.csv" 2>&1 &
smi=$!
bench() {  # label, extra args...
  local label=$1; shift
  echo "== $label start $(date +%T.%N | cut -c1-12)"
  timeout 120 python3 "$@" --cells "$CELLS" --out "/tmp/r-$label" > "$out/$label.txt" 2>&1
  grep -E "^  (MHA|GQA)" "$out/$label.txt" | cut -c1-110
  echo "== $label end $(date +%T.%N | cut -c1-12)"
}
P="-m benchmarks.bench_prefill"
case "$1" in
  X)
    bash .device/flash_attn.sh fa4-stage1
    bench alone-a $P --providers fused
    bench alone-long $P --providers fused --warmup-ms 200 --rep-ms 300
    timeout 150 python3 -m benchmarks.bench_overhead --out "$out/overhead" > "$out/overhead.txt" 2>&1
    grep -E "fused|auto|flash|sdpa|pre_step" "$out/overhead.txt" | cut -c1-150 | head -20 ;;
  Y)
    bash .device/flash_attn.sh fa4-stage2
    printf 'import sys, runpy\nimport flash_attn.cute  # noqa\nsys.argv[0] = "bench_prefill"\nrunpy.run_module("benchmarks.bench_prefill", run_name="__main__")\n' > /tmp/with_fa4.py
    bench imported /tmp/with_fa4.py --providers fused
    bench after-fa4 $P --providers fused,flash4
    bench after-fa4-long $P --providers fused,flash4 --warmup-ms 200 --rep-ms 300
    bench alone-b $P --providers fused
    bench after-fa4-b $P --providers fused,flash4 ;;
esac
kill $smi
tar czf /tmp/results.tgz -C "$out" . && find "$out" -mindepth 1 -delete && mv /tmp/results.tgz "$out/results.tgz"

#!/usr/bin/env bash
# Device calls of the fifteenth session (2026-12-01), back to back in one lease; logs under $OUT.
#   1  carry [.device/fa4-a, .device/flash_attn.sh, abtree]: fa4 stage 1
#   2  carry [.device/fa4-b, .device/flash_attn.sh, abtree]: fa4 stage 2, then the GPU suite (shards)
#   3  carry [abtree]: small pages in place vs copied (abtree/pages_ab.py), prefill chunk cells, the mixed suite
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
case "$1" in
  1) bash .device/flash_attn.sh fa4-stage1 ;;
  2)
    bash .device/flash_attn.sh fa4-stage2
    python3 -c "import flash_attn.cute, torch, triton; print('fa4 ok; torch', torch.__version__, 'triton', triton.__version__)"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
    start=$SECONDS
    T=330 bash scripts/gpu_tests.sh "$out/gpu"; echo "suite rc=$? in $((SECONDS - start)) s"
    grep -h -E "^(FAILED|ERROR)" "$out"/gpu/*.log | head -20 ;;
  3)
    start=$SECONDS
    timeout 300 python3 abtree/pages_ab.py > "$out/pages-ab.txt" 2>&1; echo "pages_ab rc=$? in $((SECONDS - start)) s"
    cat "$out/pages-ab.txt" | tail -20
    start=$SECONDS
    timeout 120 python3 -m benchmarks.bench_prefill --providers fused,flash4 --cells chunk --out "$out/prefill-chunks" \
      > "$out/prefill-chunks.txt" 2>&1; echo "prefill chunks rc=$? in $((SECONDS - start)) s"
    sed -n '/^## prefill/,/<details>/p' "$out/prefill-chunks/prefill.md" | cut -c1-200
    start=$SECONDS
    timeout 200 python3 -m benchmarks.bench_mixed --out "$out/mixed" > "$out/mixed.txt" 2>&1
    echo "mixed rc=$? in $((SECONDS - start)) s"
    sed -n '/^## mixed/,/<details>/p' "$out/mixed/mixed.md" | cut -c1-300 ;;
  4)
    # mixed batches over a non-paged cache: the contiguous prefill class without / with the small decode tile
    small="prefill/contiguous=tma+int32_offsets+heavy_tiles_first+small_block_m:16"
    for round in 1 2; do
      for v in default small; do
        if [ $v = small ]; then export ATTN_FUSED_VARIANTS=$small; else unset ATTN_FUSED_VARIANTS; fi
        timeout 100 python3 -m benchmarks.bench_mixed --providers fused,fused_dense --out "$out/mixed-$v-$round" \
          > "$out/mixed-$v-$round.txt" 2>&1
        echo "== mixed $v round $round rc=$?"
        grep -E "^\| M[12]" "$out/mixed-$v-$round/mixed.md" | head -6 | cut -c1-120
        timeout 100 python3 -m benchmarks.bench_prefill --providers fused --cells "d256,d64" --out "$out/prefill-$v-$round" \
          > "$out/prefill-$v-$round.txt" 2>&1
        echo "== prefill $v round $round rc=$?"
        grep -E "^\| d" "$out/prefill-$v-$round/prefill.md" | head -6 | cut -c1-100
      done
    done
    unset ATTN_FUSED_VARIANTS
    timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_attention_grid_gpu.py \
      -k "not fused or bias or arbitrary or training" > "$out/grid-d.log" 2>&1
    echo "grid-d rc=$?: $(tail -1 "$out/grid-d.log")" ;;
  5)
    start=$SECONDS
    timeout 400 python3 abtree/dense_mixed_ab.py > "$out/dense-mixed-ab.txt" 2>&1; echo "rc=$? in $((SECONDS - start)) s"
    cat "$out/dense-mixed-ab.txt" | grep -v "^  " | tail -50 ;;
  6)
    start=$SECONDS
    T=400 bash scripts/gpu_tests.sh "$out/gpu"; echo "suite rc=$? in $((SECONDS - start)) s"
    grep -h -E "^(FAILED|ERROR)" "$out"/gpu/*.log | head -20
    timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_kernels_gpu.py -k contiguous 2>&1 | tail -3
    timeout 100 python3 -m benchmarks.bench_mixed --providers fused,fused_dense --out "$out/mixed-dense" \
      > "$out/mixed-dense.txt" 2>&1; echo "mixed rc=$?"
    grep -E "^\| M[12]" "$out/mixed-dense/mixed.md" | head -6 | cut -c1-120 ;;
  7)
    start=$SECONDS
    timeout 300 python3 abtree/paged_mixed_tiles.py > "$out/paged-mixed-tiles.txt" 2>&1; echo "rc=$? in $((SECONDS - start)) s"
    grep -v "^  " "$out/paged-mixed-tiles.txt" | tail -40 ;;
  8)
    start=$SECONDS
    timeout 300 python3 abtree/hopper_mixed_ab.py > "$out/hopper-mixed-ab.txt" 2>&1; echo "rc=$? in $((SECONDS - start)) s"
    grep -v "^  " "$out/hopper-mixed-ab.txt" | tail -20 ;;
  9)
    start=$SECONDS
    timeout 330 python3 abtree/decode_small_ab.py > "$out/decode-small-ab.txt" 2>&1; echo "rc=$? in $((SECONDS - start)) s"
    grep -E "best|default|cuDNN" "$out/decode-small-ab.txt"; tail -3 "$out/decode-small-ab.txt" ;;
esac
cd "$out" && tar czf /tmp/results.tgz . && find . -mindepth 1 -maxdepth 1 -exec rm -rf {} + && mv /tmp/results.tgz results.tgz

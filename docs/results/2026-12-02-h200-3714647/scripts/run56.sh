#!/bin/bash
# session 26, device call 6: GPU test shards on 75766c1 (kernels as 2c74d7c; the run page allocator), then
# bench_decode's random-order and served-order cells (SDPA competitors; flash-attn-4 not carried)
export PYTHONUNBUFFERED=1 PYTHONPATH=. OMP_NUM_THREADS=1 BENCH_COMMIT=75766c1+memo
mkdir -p $OUT/tests
g=tests/gpu/test_attention_grid_gpu.py
(timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_decode_gpu.py tests/gpu/test_hopper_direct_launch_gpu.py tests/test_fused_launches.py tests/test_decode_graph.py > $OUT/tests/decode.log 2>&1; echo rc=$? >> $OUT/tests/decode.log) &
(timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_serving_gpu.py tests/gpu/test_kv_append_gpu.py tests/test_serving_simulation.py tests/test_fused_backend.py tests/test_page_allocator.py tests/test_inference_params.py > $OUT/tests/serving.log 2>&1; echo rc=$? >> $OUT/tests/serving.log) &
(timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu $g -k "fused and masks_heads" > $OUT/tests/grid-masks.log 2>&1; echo rc=$? >> $OUT/tests/grid-masks.log) &
(timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_mixed_gpu.py tests/gpu/test_hopper_gpu.py tests/gpu/test_kernels_gpu.py -k "paged or split or mixed or graph" > $OUT/tests/kernels.log 2>&1; echo rc=$? >> $OUT/tests/kernels.log) &
wait
for f in $OUT/tests/*.log; do echo "$f: $(grep -E 'passed|failed|error' $f | tail -1) $(tail -1 $f)"; done
unset OMP_NUM_THREADS
timeout 200 python3 -m benchmarks.bench_decode --budget-s 180 --cells "64x4k p16,128x2k p16,64x4k non-paged,32x2k p16" --out /tmp/decode > /tmp/decode.log 2>&1; tail -1 /tmp/decode.log
cp /tmp/decode/decode.md /tmp/decode/decode.csv /tmp/decode/decode.png /tmp/decode.log $OUT/ 2>&1
grep "^| [0-9]" $OUT/decode.md | cut -c1-300 | head -8

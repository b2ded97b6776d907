#!/bin/bash
# Call 3 (2026-12-03, thirty-eighth session): the commit with kv_heads_per_item's rule as the default: the GPU test
# shards that run the decode kernel (in parallel), then bench_decode twice (torch SDPA cuDNN / flash beside ours;
# flash-attn not carried) and the decode targets over both runs. ~8 minutes; outputs tarred after every step.
export PYTHONUNBUFFERED=1 PYTHONPATH=. BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT} OMP_NUM_THREADS=1
R=/tmp/runs && mkdir -p $R/tests
save() { tar czf $OUT/runs.tgz -C /tmp runs; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv,noheader > $R/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/gpu.txt 2>&1
grid=tests/gpu/test_attention_grid_gpu.py
shard() { local name=$1; shift
  ( timeout 200 python3 -m pytest -q -p no:cacheprovider "$@" > $R/tests/$name.log 2>&1; echo "rc=$?" >> $R/tests/$name.log ) & }
shard decode -m gpu tests/gpu/test_hopper_decode_gpu.py -k "not split and not fixed"
shard decode-split -m gpu tests/gpu/test_hopper_decode_gpu.py -k "split or fixed"
shard direct -m gpu tests/gpu/test_hopper_direct_launch_gpu.py tests/test_decode_graph.py
shard grid-a -m gpu "$grid" -k "fused and (masks_heads or padding_masks or automatic)"
shard serving tests/gpu/test_kv_append_gpu.py tests/gpu/test_serving_gpu.py tests/test_serving_simulation.py
shard mixed -m gpu tests/gpu/test_hopper_mixed_gpu.py
wait
for f in $R/tests/*.log; do echo "== $f: $(grep -E '(passed|failed|error)' $f | tail -1) $(tail -1 $f)"; done
save
for run in a b; do
  timeout 170 python3 -m benchmarks.bench_decode --budget-s 150 --quiet --out $R/$run > $R/$run-decode.log 2>&1
  save
done
python3 -m benchmarks.targets $R/a/decode.csv $R/b/decode.csv > $R/targets.md 2>&1
cat $R/targets.md | head -40
save

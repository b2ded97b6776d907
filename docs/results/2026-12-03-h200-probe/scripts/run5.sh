#!/usr/bin/env bash
# Call 6: main with the mixed kernel's 192 / 104 rule (8-row decode tiles): the GPU tests that run the mixed kernel,
# then bench_mixed's M1 / M2 against the old split forced (176 / 136), alternating processes, two rounds.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD BENCH_COMMIT=${BENCH_COMMIT:?set BENCH_COMMIT}
R=/tmp/ab2 && mkdir -p $R
save() { tar czf $OUT/ab2.tgz -C /tmp ab2; }
timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_mixed_gpu.py \
  tests/gpu/test_hopper_direct_launch_gpu.py tests/gpu/test_serving_gpu.py > $R/gpu-tests.log 2>&1
tail -2 $R/gpu-tests.log
save
CELLS="M1 2k prefill + 128,M2 2k chunk,probe"
for i in 1 2; do
  for v in rule old; do
    if [ $v = old ]; then export ATTN_FUSED_HOPPER_MIXED_TILE=64,2,64,3,176,136,128; else unset ATTN_FUSED_HOPPER_MIXED_TILE; fi
    timeout 60 python3 -m benchmarks.bench_mixed --cells "$CELLS" --providers fused --quiet --out $R/$v$i \
      > $R/$v$i.log 2>&1
    save
  done
done
python3 - <<'PY'
import csv, glob
for f in sorted(glob.glob('/tmp/ab2/*/mixed.csv')):
    for r in csv.DictReader(open(f)):
        if r['provider'] == 'fused' and r['status'] == 'ok':
            print(f.split('/')[3], r['cell'][:48].ljust(48), r['us'][:7])
PY

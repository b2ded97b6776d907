#!/usr/bin/env bash
# Call 2: the wide kernel's GPU tests (the call's total_q now its real token count, so the host plans 8-row decode
# tiles), then wide_probe.py. Usage: bash run2.sh (from the repository root; $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=docs/results/2026-12-03-h200-wide/scripts
R=/tmp/wide2 && mkdir -p $R
save() { tar czf $OUT/wide2.tgz -C /tmp wide2; }
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_hopper_mixed_gpu.py -k wide \
  > $R/gpu-tests-wide.log 2>&1
rc=$?
tail -4 $R/gpu-tests-wide.log; echo "tests rc=$rc"
save
[ $rc = 124 ] && exit 0
timeout 330 python3 $S/wide_probe.py --quiet > $R/probe.txt 2>&1
echo "probe rc=$?"
cat $R/probe.txt | grep -v Warning
save

#!/usr/bin/env bash
# The next lease's calls (prepared in the sixty-ninth session, after every pending GPU test passed on an H200):
#   suite    the whole GPU suite in parallel shards (as the sixty-sixth session's next.sh suite; no flash-attn needed):
#            the head has not run it whole since the kernels of 0d053c4
#   stage-a / stage-b / install / targets   every target read again on an H200 (carry .device/fa4-a, -b, -c;
#            targets needs BENCH_COMMIT): the targets' fused_dpa rows of M1 / M2 show the device rule and the
#            Gluon prefill's own tail zeros
# Usage (repository root; $OUT): BENCH_COMMIT=<hash> bash docs/results/2026-12-06-h200-0513344/scripts/next.sh STEP ...
set -u
for step in "$@"; do
  case $step in
    suite|stage-a|stage-b|install|targets) bash docs/results/2026-12-05-h200-b6f9e7f/scripts/next.sh $step ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done

#!/usr/bin/env bash
# Run CI's command as CI does: `.ci/run` in a fresh clone of the committed main (a new .venv, ~2.4 GB),
# then delete the clone. CI runs on this machine's disk: clones left behind once filled it, and CI's
# pip install failed with "No space left on device" (the fifty-seventh session's log).
# Usage: scripts/ci_local.sh [LOG]   (default ci-local.log in the repository root; prints the tail and the exit code)
set -u
case ${1:-} in
  -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "ci_local.sh: unknown option $1 (usage: scripts/ci_local.sh [LOG])" >&2; exit 2 ;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
log=${1:-$repo/ci-local.log}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
start=$(date +%s)
(cd "$work/clone" && CI=true bash .ci/run) > "$log" 2>&1
rc=$?
tail -n 3 "$log"
echo "ci_local: rc=$rc in $(( $(date +%s) - start )) s (log $log)"
exit $rc

#!/usr/bin/env bash
# Compile every sm90 launch of tests/sm90_compile.py with the device's Triton (3.6.0, ../shared/DEVICE.md) in place of
# this machine's: the two accept different Gluon and allocate registers differently (a ZERO_TAIL build spilled 96 B
# on 3.9 and none on 3.6). The package goes to a venv of its own (needs the package index once); the project's
# .venv supplies torch. Usage: scripts/sm90_compile_device_triton.sh [--registers]   (~3 min on 2 cores)
set -eu
case ${1:-} in
  -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
version=${TRITON_DEVICE_VERSION:-3.6.0}
venv=${TRITON_DEVICE_VENV:-/tmp/triton-$version}
if ! "$venv/bin/python" -c "import sys, triton; sys.exit(triton.__version__ != '$version')" 2>/dev/null; then
  "$repo/.venv/bin/python" -m venv "$venv"   # (the project's Python: one site-packages serves both)
  "$venv/bin/pip" install -q "triton==$version"
fi
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cd "$repo"
PYTHONPATH="$site:$repo" exec .venv/bin/python -m tests.sm90_compile "$@"

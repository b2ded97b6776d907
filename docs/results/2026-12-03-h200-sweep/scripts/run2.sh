#!/bin/bash
# Call 5 (2026-12-03), carry [".device/fa4-a", ".device/flash_attn.sh"]: flash-attn-4's first half copied in
# (run3.sh installs it on the same machine). Seconds.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
bash .device/flash_attn.sh fa4-stage1

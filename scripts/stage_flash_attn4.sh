#!/usr/bin/env bash
# flash-attn-4's staging under its earlier name (the session records call it): scripts/stage_flash_attn.sh 4 ...
# Usage (repository root, on the device): bash scripts/stage_flash_attn4.sh a|b|install
exec bash "$(dirname "$0")/stage_flash_attn.sh" 4 "$@"

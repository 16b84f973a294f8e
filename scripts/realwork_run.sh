#!/bin/bash
# The real-work study's run on qwen2.5-coder-1.5b, exactly as started (issue 42): resumable, so running it again goes
# on where it stopped (every finished problem is a line of results/realwork_humaneval.jsonl and is skipped).
# Consecutive stages on the same problems go batch by batch (4 problems, sorted by prompt length: little padding),
# each batch prefilled once for all of them; so full depth and the first D3 settings land together, problem by
# problem. Then: python scripts/realwork_study.py report
set -euo pipefail
cd "$(dirname "$0")/.."
FIRST="full@20;d3 calibrated a0.998@20;d3 calibrated a0.999@20;d3 middle_out a0.998@20;d3 calibrated a0.995@20"
THEN="d3 bottom_up a0.998@20;d3 calibrated s24 a0.998@20;unified 0.9@20;skipdecode 0.9@20;early_exit 0.9@20;d3 calibrated a0.9995@20"
LATER="full@all;d3 calibrated a0.998@all;d3 calibrated a0.999@all;d3 middle_out a0.998@all"
exec nice -n 10 python scripts/realwork_study.py run --bench humaneval --dtype float32 --batch 4 --threads 2 \
  --max-new-tokens 160 --stages "$FIRST|$THEN|$LATER"

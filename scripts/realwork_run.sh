#!/bin/bash
# The real-work study's run on qwen2.5-coder-1.5b, exactly as started (issue 42): resumable, so running it again goes
# on where it stopped (every finished problem is a line of results/realwork_humaneval.jsonl and is skipped). Stages
# after full@20 run on the problems full depth has answered ("@full"); full@40 and full@all come last, so a rerun
# after them extends every setting to those problems. Then: python scripts/realwork_study.py report
set -euo pipefail
cd "$(dirname "$0")/.."
STAGES="full@20;d3 calibrated a0.998@full;d3 calibrated a0.999@full;d3 middle_out a0.998@full;d3 bottom_up a0.998@full;d3 calibrated a0.995@full;d3 calibrated s24 a0.998@full;unified 0.9@full;skipdecode 0.9@full;early_exit 0.9@full;d3 calibrated a0.9995@full;full@40;full@all"
exec nice -n 10 python scripts/realwork_study.py run --bench humaneval --dtype float32 --batch 20 --threads 2 \
  --max-new-tokens 160 --stages "$STAGES"

#!/bin/bash
# The real-work study's second benchmark (issue 42 item 2), queued after HumanEval and not run yet: BBH word sorting
# (BIG-bench's word_sorting, the data `bash scripts/fetch_data.sh` fetches), lists of 10 words or more, 3-shot, the
# sorted words on one line (answers of 30-50 tokens), exact match; the first 60 problems of the seeded shuffle.
# Chosen because it is a BBH task the D3 paper reports on, its answer is generated (not an option's likelihood), long
# enough to reach D3's decay, and scored exactly with no judge. Same harness and shortcut as HumanEval; resumable.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
COMMON=(--bench word_sorting --dtype float32 --threads 2 --batch 16)
SETTINGS="d3 calibrated a0.998;d3 calibrated a0.995;d3 calibrated a0.99;d3 middle_out a0.995;d3 bottom_up a0.995"
SETTINGS+=";d3 calibrated s24 a0.995;unified 0.9;skipdecode 0.9;early_exit 0.9;d3 calibrated a0.98"
nice -n 19 "$PY" scripts/realwork_study.py run "${COMMON[@]}" --stages "full@60"
nice -n 19 "$PY" scripts/realwork_study.py run "${COMMON[@]}" --stages "${SETTINGS//;/@60;}@60"

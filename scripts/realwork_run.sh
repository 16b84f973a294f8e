#!/bin/bash
# The real-work study's run on qwen2.5-coder-1.5b, exactly as started (issue 42): resumable, so running it again goes
# on where it stopped (every finished problem is a line of results/realwork_humaneval.jsonl and is skipped; every
# setting's pass over full depth's reply a line of results/realwork_humaneval_forced.jsonl).
#   1. full depth on all 164 problems (batches of 16 sorted by prompt length);
#   2. the shortcut checked on the records written by free decoding (results/realwork_humaneval_shortcut_check.json);
#   3. every setting read over full depth's replies in one pass per batch (the batch's prompts prefilled once for all
#      settings), then, setting after setting in the order below, the problems it changes answered freely.
# 2 threads, float32 (nice 19 by default: NICE=0 gives it a fair share beside other work). Pause: kill -STOP <pid>; resume: kill -CONT <pid> (the pid is
# in the log's first line, or: pgrep -f realwork_study). Then: python scripts/realwork_study.py report
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
COMMON=(--bench humaneval --dtype float32 --threads 2 --max-new-tokens 160)
echo "realwork_run.sh: pid $$, $(date -u)" >&2
nice -n "${NICE:-19}" "$PY" scripts/realwork_study.py run "${COMMON[@]}" --batch 16 --stages "full@all"
[[ -f results/realwork_humaneval_shortcut_check.json ]] || \
  nice -n "${NICE:-19}" "$PY" scripts/realwork_study.py verify "${COMMON[@]}" --batch 8
# LABEL@N: the setting on the first N problems of the seeded shuffle (all: every problem); consecutive settings on
# the same N are one group: all their passes first (one prefill per batch for all), then, setting after setting, the
# problems each changes (d3/research/realwork_report.py reads these lines for each row's problems). α 0.998 and 0.995
# ran on all 164 problems; the rest on the first 32 of the seeded shuffle (paired with full depth on those 32), the
# frontier's top first, a later start, the orders, the collapse, the baselines at about 90% depth (early exit
# last: it answers one problem at a time): a study that
# fits one session of a shared 2-core machine (all 164 for every setting is about 20 CPU-hours).
SETTINGS="d3 calibrated a0.998@all;d3 calibrated a0.995@all"
SETTINGS+=";d3 calibrated a0.9995@32;d3 calibrated a0.999@32;d3 calibrated s24 a0.998@32;d3 middle_out a0.998@32"
SETTINGS+=";d3 bottom_up a0.998@32;d3 calibrated a0.99@32;unified 0.9@32;skipdecode 0.9@32;d3 calibrated a0.98@32"
SETTINGS+=";early_exit 0.9@32"
STAGES="$SETTINGS"
nice -n "${NICE:-19}" "$PY" scripts/realwork_study.py run "${COMMON[@]}" --batch 16 --stages "$STAGES"

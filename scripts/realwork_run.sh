#!/bin/bash
# The real-work study's run on qwen2.5-coder-1.5b, exactly as started (issue 42): resumable, so running it again goes
# on where it stopped (every finished problem is a line of results/realwork_humaneval.jsonl and is skipped; every
# setting's pass over full depth's reply a line of results/realwork_humaneval_forced.jsonl).
#   1. full depth on all 164 problems (batches of 16 sorted by prompt length);
#   2. the shortcut checked on the records written by free decoding (results/realwork_humaneval_shortcut_check.json);
#   3. every setting read over full depth's replies in one pass per batch (the batch's prompts prefilled once for all
#      settings), then, setting after setting in the order below, the problems it changes answered freely.
# It takes only idle CPU (nice 19), 2 threads, float32. Pause: kill -STOP <pid>; resume: kill -CONT <pid> (the pid is
# in the log's first line, or: pgrep -f realwork_study). Then: python scripts/realwork_study.py report
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
COMMON=(--bench humaneval --dtype float32 --threads 2 --max-new-tokens 160)
echo "realwork_run.sh: pid $$, $(date -u)" >&2
SETTINGS="d3 calibrated a0.998;d3 calibrated a0.995;d3 calibrated a0.999;d3 calibrated a0.99;d3 middle_out a0.998"
# After the first five, the frontier's breadth first: the collapse end, the other orders, a later start, the baselines
SETTINGS+=";d3 calibrated a0.98;d3 bottom_up a0.998;d3 calibrated s24 a0.998;unified 0.9;skipdecode 0.9;early_exit 0.9"
SETTINGS+=";d3 calibrated a0.9995;d3 middle_out a0.995;d3 bottom_up a0.995;d3 calibrated s24 a0.995"
SETTINGS+=";unified 0.7;skipdecode 0.7;early_exit 0.7"
nice -n 19 "$PY" scripts/realwork_study.py run "${COMMON[@]}" --batch 16 --stages "full@all"
[[ -f results/realwork_humaneval_shortcut_check.json ]] || \
  nice -n 19 "$PY" scripts/realwork_study.py verify "${COMMON[@]}" --batch 8
# The first five settings are a group ("|"): its passes over full depth's replies, then the problems each changes.
# Every later setting is one group: all their passes first (one prefill per batch for all: each setting's first
# change on every problem, cheap), then, setting after setting in the order above, the problems each changes.
IFS=';' read -ra ALL <<< "$SETTINGS"
STAGES=""
for k in "${!ALL[@]}"; do
  (( k == 0 )) || { (( k == 5 )) && STAGES+="|" || STAGES+=";"; }
  STAGES+="${ALL[$k]}@all"
done
nice -n 19 "$PY" scripts/realwork_study.py run "${COMMON[@]}" --batch 16 --stages "$STAGES"

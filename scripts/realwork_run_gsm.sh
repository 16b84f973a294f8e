#!/bin/bash
# The real-work study's second benchmark (issue 42 item 2): GSM-Symbolic from Reasoning Gym (d3/research/realwork.py
# says why it replaced BBH word sorting), 60 problems of seed 2026, 3 worked shots, raw completion, the working and a
# final "#### N" (answers of about 100 tokens), scored by Reasoning Gym's own score_answer. Same harness and shortcut
# as HumanEval; resumable (run it again to go on). NICE=0 gives it a fair share beside other work (default 19).
# The settings, in the order they are answered: the calibrated order at six depths (α 0.9995, about 97% of depth on
# these answers, down to α 0.98), middle_out, bottom_up and a later start at α 0.998, SkipDecode and Unified at
# about 90% depth, early exit last (it answers one problem at a time). Then: python scripts/realwork_study.py report
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
COMMON=(--bench gsm_symbolic --dtype float32 --threads 2 --batch 16)
echo "realwork_run_gsm.sh: pid $$, $(date -u)" >&2
nice -n "${NICE:-19}" "$PY" scripts/realwork_study.py run "${COMMON[@]}" --stages "full@all"
# "|" ends a group: each group's passes over full depth's replies run first, then the problems each setting changes,
# so the frontier's first rows are answered before the later groups' passes start.
SETTINGS="d3 calibrated a0.998;d3 calibrated a0.995|d3 calibrated a0.999;d3 calibrated a0.99;d3 calibrated a0.9995"
SETTINGS+="|d3 middle_out a0.998;d3 bottom_up a0.998;d3 calibrated s24 a0.998|unified 0.9;skipdecode 0.9"
SETTINGS+="|d3 calibrated a0.98;early_exit 0.9"
STAGES="${SETTINGS//;/@all;}"
nice -n "${NICE:-19}" "$PY" scripts/realwork_study.py run "${COMMON[@]}" --stages "${STAGES//|/@all|}@all"

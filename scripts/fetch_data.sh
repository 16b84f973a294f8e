#!/usr/bin/env bash
# Fetch the BIG-bench task files used by D3 Explorer into ${D3_DATA_DIR:-~/.cache/d3-explorer/data}.
# Downloads the bigbench sdist from PyPI (no install, no dependencies) and extracts only the task.json
# files listed by `python -m d3.research.data paths`. Idempotent: does nothing when they are all there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
VERSION="$("$PYTHON" -c 'from d3.research.data import BIGBENCH_VERSION; print(BIGBENCH_VERSION)')"
DATA_DIR="${D3_DATA_DIR:-$HOME/.cache/d3-explorer/data}"
SDIST="$DATA_DIR/bigbench-$VERSION.tar.gz"
ROOT="bigbench-$VERSION/bigbench/benchmark_tasks/"
mapfile -t MEMBERS < <("$PYTHON" -m d3.research.data paths)

missing=()
for m in "${MEMBERS[@]}"; do
  [[ -f "$DATA_DIR/bigbench/${m#"$ROOT"}" ]] || missing+=("$m")
done
if (( ${#missing[@]} == 0 )); then
  echo "BIG-bench data already in $DATA_DIR/bigbench"
  exit 0
fi

mkdir -p "$DATA_DIR"
if [[ ! -f "$SDIST" ]]; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: --dest "$DATA_DIR" "bigbench==$VERSION"
fi
tmp="$(mktemp -d "$DATA_DIR/.extract.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$SDIST" -C "$tmp" -- "${missing[@]}"
mkdir -p "$DATA_DIR/bigbench"
cp -R "$tmp/$ROOT." "$DATA_DIR/bigbench/"
echo "Extracted ${#missing[@]} task file(s) into $DATA_DIR/bigbench"

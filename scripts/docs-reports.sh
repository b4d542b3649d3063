#!/usr/bin/env bash
# Regenerate docs/report-*.html (quantrack report) and their screenshots docs/report-*.png (headless Chromium)
# from the H200 MLflow stores in docs/gpu/ and, when CPU_STORE is given, from a CPU study's store:
#
#   bash scripts/docs-reports.sh                                     # the H200 reports
#   CPU_STORE=/tmp/cpu/mlruns/mlflow.db bash scripts/docs-reports.sh   # + docs/report-cpu-smollm2.*
#
# The stores are unpacked into a temporary directory (the report finds each run's artifacts beside the
# database, <db dir>/artifacts/<run id>/artifacts, wherever the archive is unpacked). Each report runs from the
# folder that holds the store, with a relative URI, so a committed page names the store as the archive (or the
# study's default, sqlite:///mlruns/mlflow.db) holds it, never a temporary path.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
tmp=$(mktemp -d /tmp/qt-docs-reports.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome)
mkdir -p "$tmp/s1" "$tmp/s2"
tar -xzf docs/gpu/h200-mlflow-store.tar.gz -C "$tmp/s2"
tar -xzf docs/gpu/h200-mlflow-store-session1.tar.gz -C "$tmp/s1"

H200_SLO=(--slo 'tpot_p99<=30ms@64' --slo 'ttft_p99<=3s@64' --max-accuracy-drop 1pp)
report() {  # name experiment store-dir relative-uri args...
  local name=$1 exp=$2 dir=$3 uri=$4
  shift 4
  (cd "$dir" && python -m quantrack.cli report --experiment "$exp" --tracking-uri "$uri" \
    --out "$repo/docs/report-$name.html" "$@")
  "$browser" --headless --no-sandbox --disable-gpu --disable-background-networking --hide-scrollbars \
    --user-data-dir="$tmp/profile" --window-size=1280,2300 --screenshot="docs/report-$name.png" \
    "file://$PWD/docs/report-$name.html" 2>/dev/null
}
report h200-vllm h200-vllm "$tmp/s2" "sqlite:///qt-mlruns/mlflow.db" "${H200_SLO[@]}"
report h200-sglang h200-sglang "$tmp/s2" "sqlite:///qt-mlruns/mlflow.db" "${H200_SLO[@]}"
# session 1 (memory fraction 0.92 / 0.903): the store with the node's FP8 GEMM probe (speedup vs batch)
report h200-vllm-session1 h200-vllm "$tmp/s1" "sqlite:///qt-mlruns/mlflow.db" "${H200_SLO[@]}"
if [ -n "${CPU_STORE:-}" ]; then
  # the constraints come from examples/cpu-smollm2.toml's [decision] table (the study file on the parent run);
  # CPU_STORE is <dir>/mlruns/mlflow.db as `quantrack run` writes it in <dir>
  report cpu-smollm2 cpu-smollm2 "$(dirname "$(dirname "$CPU_STORE")")" "sqlite:///mlruns/mlflow.db"
fi

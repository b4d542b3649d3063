#!/usr/bin/env bash
# Reproduce docs/mlflow-ui.png: a real `mlflow server` on 127.0.0.1 (SQLite, temp dir), the four H200 vLLM arms
# logged with `quantrack log` from the real files in ../shared/data/vllm-h200, then headless Chromium on the
# MLflow UI's compare-runs page for the bf16 and fp8 runs. Needs chromium (not needed in CI).
#   scripts/mlflow-ui-screenshot.sh [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/mlflow-ui.png}"
data="${QUANTRACK_SHARED:-../shared}/data/vllm-h200"
tmp="$(mktemp -d)"
port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python -m mlflow server --host 127.0.0.1 --port "$port" --backend-store-uri "sqlite:///$tmp/mlflow.db" \
  --serve-artifacts --artifacts-destination "$tmp/artifacts" --workers 1 >"$tmp/server.log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 1 120); do curl -sf "$url/health" >/dev/null && break; sleep 1; done
export QUANTRACK_SPOOL_DIR="$tmp/spool"
for arm in bf16 fp8 fp8kv fp8marlin; do
  quantrack log --study tests/data/tracking/vllm-h200.toml --arm "$arm" --latency "$data/client-latency-$arm.json" \
    --server-log "$data/vllm-0.25.0-$arm.log" --tracking-uri "$url"
done
page="$(python - "$url" <<'PY'
import json, sys, urllib.parse, urllib.request
url = sys.argv[1]
exp = json.load(urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=vllm-h200-llama8b"))["experiment"]
req = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", data=json.dumps({"experiment_ids": [exp["experiment_id"]]}).encode(),
                             headers={"Content-Type": "application/json"})
runs = {r["info"]["run_name"]: r["info"]["run_id"] for r in json.load(urllib.request.urlopen(req))["runs"]}
ids = json.dumps([runs["bf16"], runs["fp8"]])
print(f"{url}/#/compare-runs?runs={urllib.parse.quote(ids)}&experiments={urllib.parse.quote(json.dumps([exp['experiment_id']]))}")
PY
)"
echo "screenshot of $page" >&2
chromium --headless --no-sandbox --disable-gpu --disable-background-networking --hide-scrollbars \
  --virtual-time-budget=20000 --window-size=1600,1000 --screenshot="$out" "$page" 2>/dev/null
echo "wrote $out" >&2

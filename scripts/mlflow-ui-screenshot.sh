#!/usr/bin/env bash
# Screenshots of the MLflow UI on the CPU study's own runs (README "Open the runs in the MLflow UI"):
#   docs/mlflow-ui-runs.png     the experiment's runs list (the arm runs under the study's parent run)
#   docs/mlflow-ui.png          the compare page of the F16 and Q4_0 arm runs
# A real `mlflow server` on 127.0.0.1 serves the store that `quantrack run examples/cpu-smollm2.toml` wrote
# (default: the README's sqlite:///mlruns/mlflow.db with artifacts under mlruns/artifacts); headless Chromium
# takes the pictures. Needs chromium (scripts/ci-system-deps.sh installs it).
#   scripts/mlflow-ui-screenshot.sh [STORE.db] [ARTIFACT_ROOT]
set -euo pipefail
cd "$(dirname "$0")/.."
db="${1:-mlruns/mlflow.db}"
artifacts="${2:-mlruns/artifacts}"
[ -f "$db" ] || { echo "mlflow-ui-screenshot: no store at $db: run 'quantrack run examples/cpu-smollm2.toml' first" >&2; exit 2; }
tmp="$(mktemp -d)"
port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python -m mlflow server --host 127.0.0.1 --port "$port" --backend-store-uri "sqlite:///$(realpath "$db")" \
  --default-artifact-root "$(realpath "$artifacts")" --workers 1 >"$tmp/server.log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 1 120); do curl -sf "$url/health" >/dev/null && break; sleep 1; done
read -r runs_page compare_page < <(python - "$url" <<'PY'
import json, sys, urllib.parse, urllib.request
url = sys.argv[1]
exp = json.load(urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=cpu-smollm2"))["experiment"]
req = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", data=json.dumps({"experiment_ids": [exp["experiment_id"]],
                             "order_by": ["attributes.start_time DESC"]}).encode(), headers={"Content-Type": "application/json"})
runs = {}
for r in json.load(urllib.request.urlopen(req))["runs"]:
    runs.setdefault(r["info"]["run_name"], r["info"]["run_id"])  # the newest run of each name
eid = exp["experiment_id"]
ids = json.dumps([runs["F16"], runs["Q4_0"]])
# the model-training view, the arm runs listed flat (the filter the README gives: one row per arm, not the
# collapsed parent)
flt = urllib.parse.quote("tags.`quantrack.role` = 'arm'")
print(f"{url}/#/experiments/{eid}/runs?workflowType=machine_learning&searchFilter={flt}",
      f"{url}/#/compare-runs?runs={urllib.parse.quote(ids)}&experiments={urllib.parse.quote(json.dumps([eid]))}"
      "&workflowType=machine_learning")
PY
)
shot() {
  chromium --headless --no-sandbox --disable-gpu --disable-background-networking --hide-scrollbars \
    --virtual-time-budget=25000 --window-size=1600,1000 --screenshot="$2" "$1" 2>/dev/null
  echo "wrote $2 ($1)" >&2
}
shot "$runs_page" docs/mlflow-ui-runs.png
shot "$compare_page" docs/mlflow-ui.png

#!/usr/bin/env bash
# Screenshots of the MLflow UI on the CPU study's own runs (README "Open the runs in the MLflow UI"):
#   docs/mlflow-ui-runs.png     the experiment's runs list, filtered to the arm runs and sorted by name (sorted by
#                               its default, Created, MLflow nests them under the collapsed parent instead)
#   docs/mlflow-ui.png          the compare page of two arm runs (default F16 and Q4_0)
# A real `mlflow server` on 127.0.0.1 serves the store that `quantrack run examples/cpu-smollm2.toml` wrote
# (default: the README's sqlite:///mlruns/mlflow.db with artifacts under mlruns/artifacts); headless Chromium
# takes the pictures. Needs chromium (scripts/ci-system-deps.sh installs it).
#   scripts/mlflow-ui-screenshot.sh [STORE.db] [ARTIFACT_ROOT] [EXPERIMENT] [ARM_A] [ARM_B]
# MLflow 3.17's UI opens every experiment in its GenAI view unless the URL says workflowType=machine_learning (or
# the browser remembers the "Model training" switch): the mlflow.experimentKind tag is not read while that switch
# exists (server/js main bundle: the workflow-type feature flag is on, localStorage "mlflow.workflowType").
set -euo pipefail
cd "$(dirname "$0")/.."
db="${1:-mlruns/mlflow.db}"
artifacts="${2:-mlruns/artifacts}"
experiment="${3:-cpu-smollm2}"
arm_a="${4:-F16}"
arm_b="${5:-Q4_0}"
[ -f "$db" ] || { echo "mlflow-ui-screenshot: no store at $db: run 'quantrack run examples/cpu-smollm2.toml' first" >&2; exit 2; }
tmp="$(mktemp -d)"
port="$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python -m mlflow server --host 127.0.0.1 --port "$port" --backend-store-uri "sqlite:///$(realpath "$db")" \
  --default-artifact-root "$(realpath "$artifacts")" --workers 1 >"$tmp/server.log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 1 120); do curl -sf "$url/health" >/dev/null && break; sleep 1; done
read -r runs_page compare_page < <(python - "$url" "$experiment" "$arm_a" "$arm_b" <<'PY'
import json, sys, urllib.parse, urllib.request
url, name, arm_a, arm_b = sys.argv[1:5]
exp = json.load(urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}"))["experiment"]
req = urllib.request.Request(f"{url}/api/2.0/mlflow/runs/search", data=json.dumps({"experiment_ids": [exp["experiment_id"]],
                             "order_by": ["attributes.start_time DESC"]}).encode(), headers={"Content-Type": "application/json"})
runs = {}
for r in json.load(urllib.request.urlopen(req))["runs"]:
    runs.setdefault(r["info"]["run_name"], r["info"]["run_id"])  # the newest run of each name
eid = exp["experiment_id"]
ids = json.dumps([runs[arm_a], runs[arm_b]])
# the model-training view, the arm runs listed flat: the README's filter, sorted by run name (MLflow nests child
# runs under their parent when sorted by Created, its default, even when the filter matches only the children)
flt = urllib.parse.quote("tags.`quantrack.role` = 'arm'")
print(f"{url}/#/experiments/{eid}/runs?workflowType=machine_learning&searchFilter={flt}"
      "&orderByKey=attributes.run_name&orderByAsc=true",
      f"{url}/#/compare-runs?runs={urllib.parse.quote(ids)}&experiments={urllib.parse.quote(json.dumps([eid]))}"
      "&workflowType=machine_learning")
PY
)
shot() {
  chromium --headless --no-sandbox --disable-gpu --disable-background-networking --hide-scrollbars \
    --user-data-dir="$tmp/profile" \
    --virtual-time-budget=25000 --window-size=1600,1000 --screenshot="$2" "$1" 2>/dev/null
  echo "wrote $2 ($1)" >&2
}
shot "$runs_page" docs/mlflow-ui-runs.png
shot "$compare_page" docs/mlflow-ui.png

#!/usr/bin/env bash
# NOT RUN YET (written in a session without a GPU). lm-evaluation-harness's own gsm8k task on the bf16 arm of a GPU
# study, on the same engine, checkpoint and engine arguments quantrack's study uses, so the baseline accuracy is a
# number a reader already trusts, beside quantrack's:
#   scripts/gpu/lm-eval-bf16.sh examples/gpu/h200-qwen2.5-coder-1.5b-vllm.toml [OUTDIR]      (on the node, after
#   scripts/gpu/node.sh wheels / unpack / hfmodel qwen2.5-coder-1.5b; lm-eval[api] in /tmp/qt-site)
# What runs: `quantrack serve STUDY --arm bf16` (the study's launch line, qwen2.5-coder-1.5b:hf-bf16), then
# `lm_eval run --model local-completions` with the stock lm_eval/tasks/gsm8k/gsm8k.yaml pulled in by include: and only
# the dataset pointed at quantrack's shipped GSM8K files (tests/lm_eval_task.py; no hub access): all 1,319 test
# questions, the task's 5-shot default, greedy. Then `quantrack eval import` reads lm-eval's file (with Wilson
# interval) into OUTDIR/lm-eval-bf16.json, to state beside the study's bf16 run in docs/gpu/. The server is stopped at the end, whatever happened.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
study=${1:?usage: lm-eval-bf16.sh STUDY.toml [OUTDIR]}
out=${2:-/root/lm-eval-bf16}
export QUANTRACK_CACHE=${QUANTRACK_CACHE:-/root/qt-cache} PYTHONUNBUFFERED=1
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 HF_HOME="$out/hf" TOKENIZERS_PARALLELISM=false
py() { (cd "$here" && PYTHONPATH="/tmp/qt-site:$here" python3 "$@"); }
mkdir -p "$out"
py -m quantrack.cli serve "$study" --arm bf16 --log "$out/server.log" > "$out/serve.out" 2> "$out/serve.err" &
serve_pid=$!
trap 'kill -INT $serve_pid 2>/dev/null; wait $serve_pid 2>/dev/null || true' EXIT
for _ in $(seq 900); do grep -q '^ready: ' "$out/serve.out" 2>/dev/null && break
  kill -0 $serve_pid 2>/dev/null || { echo "server did not start:"; tail -5 "$out/serve.err"; exit 1; }; sleep 1; done
url=$(sed -n 's/^ready: \(http[^ ]*\).*/\1/p' "$out/serve.out")
[ -n "$url" ] || { echo "server not ready after 900 s"; exit 1; }
model=$(python3 -c "import json,sys,urllib.request; print(json.load(urllib.request.urlopen('$url/v1/models'))['data'][0]['id'])")
tok=$(py -c "from quantrack.models.ref import cached_path; print(cached_path('qwen2.5-coder-1.5b:hf-bf16'))")
include=$(py -c "from pathlib import Path; from tests.lm_eval_task import write_task; print(write_task(Path('$out')))")
(cd "$out" && PYTHONPATH="/tmp/qt-site:$here" python3 -m lm_eval run --model local-completions \
  --model_args "base_url=$url/v1/completions,model=$model,tokenizer=$tok,tokenized_requests=False,num_concurrent=64,max_retries=3,max_gen_toks=256,timeout=900" \
  --tasks gsm8k_local --include_path "$include" --output_path lm-eval-out --log_samples) 2>&1 | tee "$out/lm-eval.log" | tail -20
results=$(ls -t "$out"/lm-eval-out/*/results_*.json | head -1)
echo "lm-eval results: $results"
# quantrack's reading of lm-eval's file (strict-match headline, both filters kept, Wilson interval) for docs/gpu/
py -m quantrack.cli eval import "$results" --format lm-eval --out "$out/lm-eval-bf16.json" --json | tee "$out/import.json"

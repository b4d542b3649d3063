#!/usr/bin/env bash
# NOT RUN YET (no GPU lent in the session that wrote it). Parity of `quantrack sweep` with `vllm bench serve` on
# one H200, the setting of issue 28: one bf16 vLLM server, 1,024 tokens in / 128 out, levels 1, 16, 64.
#
# Each level runs both clients interleaved (order alternating per round) against the same server, with the same
# request count: --requests N here is vLLM's --num-prompts N. A second pass per level with quantrack's default
# count (4 x C) measures the ramp-up / drain share that explained the gap in issue 28 (see docs/benchmarks.md).
#
#   pip install vllm==0.25.0 && pip install -e '.[dev]'
#   vllm serve $MODEL --port 8000 --gpu-memory-utilization 0.92 &   # wait for /health
#   bash bench/parity_vllm_h200.sh $MODEL
set -euo pipefail
MODEL=${1:?usage: parity_vllm_h200.sh MODEL [BASE_URL]}
BASE=${2:-http://127.0.0.1:8000}
# Issue 40: every run of vllm bench serve gets a fresh --seed (the script adds 1 per run), the prefix-cache hit
# rate of each tool's run is read from /metrics, and a round whose hit rates differ by more than 0.05 gets no
# ratio. Run twice in a row on the same server (pass 1, pass 2): the ratios must agree (the cache cannot move them).
for PASS in 1 2; do
  for N in 1000 256; do
    python bench/parity_vllm_bench.py --base-url "$BASE" --engine vllm --model "$MODEL" --tokenizer "$MODEL" \
      --reference vllm --concurrency 1,16,64 --requests "$N" --input-tokens 1024 --output-tokens 128 --rounds 3 \
      --hit-rate-tolerance 0.05 --seed $((PASS * 100000 + N)) --json "parity-h200-n$N-pass$PASS.json"
  done
done

#!/usr/bin/env bash
# The H200 budget study (issue 37) from carried pieces: scripts/gpu/budget-lease.sh join|setup|start|poll
#   pieces: .carry/pNN = one tar of {vllm.tgz (build-bundle.sh vllm with COMPRESS=gzip), whl.tar
#   (build-node-wheels.sh + gguf + llmcompressor --no-deps), cal.tar (compressed-tensors 0.19.0, datasets,
#   multiprocess, auto-round 0.15.1 --no-deps: the calibration only), the Q4_K_M GGUF} split in 31,000,000-byte
#   pieces (beside the 32.4 MiB checkout: under the 64 MiB a call); each device call copies one to /root/stash (`node.sh stash .carry/pNN`).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
node="$here/scripts/gpu/node.sh"
study="$here/examples/gpu/h200-qwen2.5-coder-1.5b-budget-vllm.toml"
export QUANTRACK_CACHE=${QUANTRACK_CACHE:-/root/qt-cache}
he="$here/examples/gpu/h200-qwen2.5-coder-1.5b-humaneval-vllm.toml"
case ${1:?join|setup|start|start-short|poll} in
  join)
    cat /root/stash/p?? | tar -xf - -C /root/stash && rm -f /root/stash/p??
    sha256sum /root/stash/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf ;;
  setup)
    mkdir -p /root/vs && tar -xzf /root/stash/vllm.tgz -C /root/vs
    PYTHONPATH=/root/vs/vsite python3 -c "import vllm; print('vllm', vllm.__version__)"
    tar -xf /root/stash/whl.tar -C /root/stash && "$node" wheels /root/stash/whl
    tar -xf /root/stash/cal.tar -C /root/stash && python3 -m pip install -q --no-index --no-deps --no-compile \
      --target /tmp/cal-site /root/stash/cal/*.whl 2>&1 | tail -1
    "$node" hfmodel qwen2.5-coder-1.5b ;;
  start-short)   # a shortened lease: two runs at once, each with its own bf16 baseline (two bf16 runs: the floor)
    "$node" bg ba "$study" --arm fp8 --workdir /root/wd-ba
    sleep 20
    "$node" bg bb "$study" --arm kv-int8-per-token-head --workdir /root/wd-bb ;;
  start)   # the quantized arms (each run answers its own bf16 first; the two bf16 runs are the floor), HumanEval beside
    "$node" bg ba "$study" --arm fp8 --workdir /root/wd-ba
    m=$(cd "$here" && PYTHONPATH="/tmp/qt-site:$here" python3 -c "from quantrack.models.ref import cached_path; print(cached_path('qwen2.5-coder-1.5b:hf-bf16'))")
    (setsid nohup bash -c "cd '$here' && PYTHONPATH=/tmp/cal-site:/tmp/qt-site:$here python3 scripts/calibrate_kv.py \
      --model '$m' --out /root/qt-cache/qwen2.5-coder-1.5b.kv-fp8-calibrated > /root/cal.log 2>&1; echo \$? > /root/cal.rc" \
      < /dev/null > /dev/null 2>&1 &)
    sleep 20   # the next server starts after the first has taken its memory
    "$node" bg bb "$study" --arm kv-int8-per-token-head --arm kv-fp8-calibrated --workdir /root/wd-bb
    sleep 20
    "$node" bg he "$he" --workdir /root/wd-he ;;
  poll)
    "$node" watch "${2:-60}" ba bb he || true
    echo "== cal rc=$(cat /root/cal.rc 2>/dev/null || echo running)"; tail -3 /root/cal.log 2>/dev/null || true
    "$node" archive budget-store
    mkdir -p "$OUT/work"; for d in /root/wd-ba /root/wd-bb /root/wd-he; do [ -d $d ] && tar -czf "$OUT/work/$(basename $d).tar.gz" -C / "${d#/}"; done; true ;;
esac

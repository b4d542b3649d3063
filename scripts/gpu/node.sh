#!/usr/bin/env bash
# Drive quantrack on a lent GPU node (the H200 here) from a copy of this repository.
# Engines and wheels travel as pieces in ignored folders (.carry/, .whl/); nothing of them is committed.
#   node.sh stash PIECE...          copy bundle pieces to /root/stash (one device call per ~60 MB)
#   node.sh unpack vllm|sglang      join /root/stash/<engine>.p* and unpack to /root/vs|/root/sg (vsite/)
#   node.sh model                   start the random-weight Llama-3-8B checkpoint build in the background
#   node.sh wheels                  install .whl/*.whl (mlflow & co.) into /tmp/qt-site
#   node.sh qt ARGS...              run quantrack (python3 -m quantrack.cli ARGS) with /tmp/qt-site on the path
#   node.sh run STUDY [--arm A]...  wait for the checkpoint, make engine entry points, then `quantrack run`
#   node.sh bg NAME STUDY [ARGS]... `node.sh run` in a new session (outlives the call); log /root/NAME.log
#   node.sh watch SECS NAME...      print progress of background runs until all end or SECS pass
#   node.sh archive NAME            tar the node's tracking store (/root/qt-mlruns) into $OUT/NAME.tar.gz
# Two studies can run at once on a 2-GPU node: CUDA_VISIBLE_DEVICES=1 node.sh bg sg examples/gpu/h200-sglang.toml
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cmd=${1:?usage: node.sh stash|unpack|model|wheels|qt|run|archive}; shift
export PYTHONUNBUFFERED=1
qt() { PYTHONPATH="/tmp/qt-site:$here" python3 -m quantrack.cli "$@"; }
case $cmd in
  stash) mkdir -p /root/stash; for f in "$@"; do cp "$f" /root/stash/; done; ls -l /root/stash ;;
  unpack)
    eng=${1:?vllm|sglang}; dest=/root/vs; [ "$eng" = sglang ] && dest=/root/sg
    mkdir -p "$dest"; cat /root/stash/"$eng".p? | xz -d -T0 | tar -xf - -C "$dest"
    mod=vllm; [ "$eng" = sglang ] && mod=sglang
    PYTHONPATH="$dest/vsite" python3 -c "import $mod; print('$mod', $mod.__version__)" ;;
  model)
    if [ ! -f /root/llama8b-rand/DONE ]; then
      (setsid nohup python3 "$here/.carry/make_model.py" /root/llama8b-rand "$here/quantrack/data/gsm8k/test.jsonl" \
        > /root/make_model.log 2>&1 < /dev/null &)
    fi
    echo "checkpoint build started (log /root/make_model.log)" ;;
  wheels)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qt-site \
      "$here"/.whl/*.whl 2>&1 | tail -2
    # create the store once, before two studies may write to it at the same time
    mkdir -p /root/qt-mlruns
    PYTHONPATH=/tmp/qt-site python3 -c "import mlflow; mlflow.set_tracking_uri('sqlite:////root/qt-mlruns/mlflow.db'); \
mlflow.search_experiments(); print('mlflow', mlflow.__version__, 'store ready')" 2>&1 | tail -1 ;;
  qt) qt "$@" ;;
  run)
    for i in $(seq 120); do [ -f /root/llama8b-rand/DONE ] && break; sleep 2; done
    [ -f /root/llama8b-rand/DONE ] || { echo "checkpoint not ready"; tail -5 /root/make_model.log; exit 1; }
    # make_model.py's tokenizer has no model_max_length, so transformers reports 1e30 and SGLang 0.5.16's /tokenize
    # fails to serialise it (orjson "Integer exceeds 64-bit range", HTTP 500); give it the checkpoint's context.
    python3 - <<'PY'
import json; p = "/root/llama8b-rand/tokenizer_config.json"; c = json.load(open(p))
if c.get("model_max_length", 0) > 2**62: c["model_max_length"] = 8192; json.dump(c, open(p, "w"), indent=1)
PY
    mkdir -p /root/bin /root/qt-mlruns
    printf '#!/bin/sh\nexec python3 -c "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0]=\\"vllm\\"; sys.exit(main())" "$@"\n' > /root/bin/vllm
    printf '#!/bin/sh\nexec python3 -m sglang.launch_server "$@"\n' > /root/bin/sglang-launch
    chmod +x /root/bin/vllm /root/bin/sglang-launch
    qt run "$@" ;;
  bg)
    name=${1:?NAME}; shift; rm -f "/root/$name.rc"
    (setsid nohup bash -c "'$here/scripts/gpu/node.sh' run $* > /root/$name.log 2>&1; echo \$? > /root/$name.rc" < /dev/null > /dev/null 2>&1 &)
    echo "started $name (log /root/$name.log)" ;;
  watch)
    secs=${1:?SECS}; shift; end=$(( $(date +%s) + secs ))
    while :; do
      left=0; for n in "$@"; do [ -f "/root/$n.rc" ] || left=1; done
      [ $left = 0 ] || [ "$(date +%s)" -ge $end ] && break; sleep 10
    done
    for n in "$@"; do echo "== $n rc=$(cat /root/$n.rc 2>/dev/null || echo running)"; grep -v '^\s*$' "/root/$n.log" | tail -25; done
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader ;;
  archive)
    name=${1:?NAME}; tar -czf "$OUT/$name.tar.gz" -C /root qt-mlruns; ls -l "$OUT" ;;
  *) echo "unknown subcommand $cmd" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Drive quantrack on a lent GPU node (the H200 here) from a copy of this repository.
# Engines and wheels travel as pieces in ignored folders (.carry/, .whl/); nothing of them is committed.
#   node.sh stash PIECE...          copy bundle pieces to /root/stash (one device call per ~60 MB)
#   node.sh unpack vllm|sglang      join /root/stash/<engine>.p* and unpack to /root/vs|/root/sg (vsite/)
#   node.sh model                   start the random-weight Llama-3-8B checkpoint build in the background
#   node.sh wheels                  install .whl/*.whl (mlflow & co.) into /tmp/qt-site
#   node.sh qt ARGS...              run quantrack (python3 -m quantrack.cli ARGS) with /tmp/qt-site on the path
#   node.sh run STUDY [--arm A]...  wait for the checkpoint, make engine entry points, then `quantrack run`
#   node.sh archive NAME            tar the node's tracking store (/root/qt-mlruns) into $OUT/NAME.tar.gz
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
    PYTHONPATH=/tmp/qt-site python3 -c "import mlflow; print('mlflow', mlflow.__version__)" ;;
  qt) qt "$@" ;;
  run)
    for i in $(seq 120); do [ -f /root/llama8b-rand/DONE ] && break; sleep 2; done
    [ -f /root/llama8b-rand/DONE ] || { echo "checkpoint not ready"; tail -5 /root/make_model.log; exit 1; }
    mkdir -p /root/bin /root/qt-mlruns
    printf '#!/bin/sh\nexec python3 -c "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0]=\\"vllm\\"; sys.exit(main())" "$@"\n' > /root/bin/vllm
    printf '#!/bin/sh\nexec python3 -m sglang.launch_server "$@"\n' > /root/bin/sglang-launch
    chmod +x /root/bin/vllm /root/bin/sglang-launch
    qt run "$@" ;;
  archive)
    name=${1:?NAME}; tar -czf "$OUT/$name.tar.gz" -C /root qt-mlruns; ls -l "$OUT" ;;
  *) echo "unknown subcommand $cmd" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Drive quantrack on a lent GPU node (the H200 here) from a copy of this repository.
# Engines and wheels travel as pieces in ignored folders (.carry/, .whl/); nothing of them is committed.
#   node.sh stash PIECE...          copy bundle pieces to /root/stash (one device call per ~60 MB)
#   node.sh payload                 join /root/stash/payload.p* (one tar of everything below, split to fit the calls)
#                                   and unpack it into /root/stash: vllm.p*, sglang.p*, whl/, the SmolLM2 GGUF
#   node.sh hfmodel [NAME]          export NAME:hf-bf16 (default smollm2; quantrack.models.hfexport) from the carried GGUF
#                                   (its file name in quantrack/data/models.toml) into /root/qt-cache
#   node.sh xhf | xserve            in the background: the bf16 checkpoint through transformers (xhf), or vLLM and
#                                   SGLang (xserve), on the same token ids (scripts/gpu/xengine.py; /root/xengine)
#   node.sh unpack vllm|sglang      join /root/stash/<engine>.p* and unpack to /root/vs|/root/sg (vsite/)
#   node.sh model                   start the random-weight Llama-3-8B checkpoint build in the background
#   node.sh wheels [DIR]            install DIR/*.whl (default .whl; mlflow & co.) into /tmp/qt-site
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
export QUANTRACK_CACHE=${QUANTRACK_CACHE:-/root/qt-cache}   # model references (smollm2:hf-bf16) are provisioned here
# from $here: `python3 -m` / `-c` put the working directory first on sys.path, and it may hold another quantrack
qt() { (cd "$here" && PYTHONPATH="/tmp/qt-site:$here" python3 -m quantrack.cli "$@"); }
qtpy() { (cd "$here" && PYTHONPATH="/tmp/qt-site:$here" python3 "$@"); }
mkbins() {  # engine entry points over the carried bundles
  mkdir -p /root/bin
  printf '#!/bin/sh\nexec python3 -c "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0]=\\"vllm\\"; sys.exit(main())" "$@"\n' > /root/bin/vllm
  printf '#!/bin/sh\nexec python3 -m sglang.launch_server "$@"\n' > /root/bin/sglang-launch
  chmod +x /root/bin/vllm /root/bin/sglang-launch
}
case $cmd in
  stash) mkdir -p /root/stash; for f in "$@"; do cp "$f" /root/stash/; done; ls -l /root/stash ;;
  payload) cat /root/stash/payload.p* | tar -xf - -C /root/stash && rm -f /root/stash/payload.p*; ls -l /root/stash ;;
  hfmodel)
    ref=${1:-smollm2}   # a name of quantrack/data/models.toml; its checkpoint file carried in /root/stash
    f=$(qtpy -c "from quantrack.models.ref import known_models; print(known_models()['$ref'].file)")
    mkdir -p "$QUANTRACK_CACHE"; cp -n "/root/stash/$f" "$QUANTRACK_CACHE"/ 2>/dev/null || true
    qtpy -c "from quantrack.models.ref import resolve; r = resolve('$ref:hf-bf16', progress=print); print(r.path)" ;;
  xhf|xserve)
    mkbins; d=/root/xengine; mkdir -p $d; m=$(qtpy -c "from quantrack.models.ref import cached_path; print(cached_path('smollm2:hf-bf16'))")
    ids="$here/docs/gpu/xengine-ids.json"; x="$here/scripts/gpu/xengine.py"
    if [ "$cmd" = xhf ]; then
    (setsid nohup bash -c "cd $here; PYTHONPATH=$here python3 $x hf $m $ids $d/transformers-fp32.json > $d/hf.log 2>&1; \
      PYTHONPATH=$here python3 $x hf $m $ids $d/transformers-bf16.json --dtype bfloat16 >> $d/hf.log 2>&1; echo \$? > $d/hf.rc" < /dev/null > /dev/null 2>&1 &)
    else
    (setsid nohup bash -c "cd $here; PYTHONPATH=/tmp/qt-site:$here python3 $x serve-dump vllm $m $ids $d/vllm-bf16.json --util 0.08 \
      --arg=--attention-backend --arg=FLASH_ATTN --arg=--kv-cache-memory-bytes --arg=4294967296 --binary /root/bin/vllm \
      --env PYTHONPATH=/root/vs/vsite --env VLLM_USE_FLASHINFER_SAMPLER=0 --env VLLM_CACHE_ROOT=/root/xengine/vcache > $d/vllm.log 2>&1; echo \$? > $d/vllm.rc" < /dev/null > /dev/null 2>&1 &)
    (setsid nohup bash -c "cd $here; PYTHONPATH=/tmp/qt-site:$here python3 $x serve-dump sglang $m $ids $d/sglang-bf16.json --util 0.2 \
      --arg=--attention-backend --arg=triton --arg=--disable-prefill-cuda-graph --binary /root/bin/sglang-launch \
      --env PYTHONPATH=/root/sg/vsite > $d/sglang.log 2>&1; echo \$? > $d/sglang.rc" < /dev/null > /dev/null 2>&1 &)
    fi
    echo "xengine $cmd started in $d" ;;
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
    whl=${1:-$here/.whl}
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qt-site \
      "$whl"/*.whl 2>&1 | tail -2
    # create the store once, before two studies may write to it at the same time
    mkdir -p /root/qt-mlruns
    PYTHONPATH=/tmp/qt-site python3 -c "import mlflow; mlflow.set_tracking_uri('sqlite:////root/qt-mlruns/mlflow.db'); \
mlflow.search_experiments(); print('mlflow', mlflow.__version__, 'store ready')" 2>&1 | tail -1 ;;
  qt) qt "$@" ;;
  run)
    if grep -q llama8b-rand "$1"; then   # the random-weight checkpoint of the earlier sessions
    for i in $(seq 120); do [ -f /root/llama8b-rand/DONE ] && break; sleep 2; done
    [ -f /root/llama8b-rand/DONE ] || { echo "checkpoint not ready"; tail -5 /root/make_model.log; exit 1; }
    # make_model.py's tokenizer has no model_max_length, so transformers reports 1e30 and SGLang 0.5.16's /tokenize
    # fails to serialise it (orjson "Integer exceeds 64-bit range", HTTP 500); give it the checkpoint's context.
    python3 - <<'PY'
import json; p = "/root/llama8b-rand/tokenizer_config.json"; c = json.load(open(p))
if c.get("model_max_length", 0) > 2**62: c["model_max_length"] = 8192; json.dump(c, open(p, "w"), indent=1)
PY
    fi
    mkbins; mkdir -p /root/qt-mlruns
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
    for f in /root/xengine/*.rc; do [ -f "$f" ] && echo "xengine $(basename "$f" .rc) rc=$(cat "$f")"; done 2>/dev/null
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader ;;
  archive)
    name=${1:?NAME}; tar -czf "$OUT/$name.tar.gz" -C /root qt-mlruns; ls -l "$OUT" ;;
  *) echo "unknown subcommand $cmd" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# NOT RUN YET (written in a session without a GPU). The node check of the Qwen2 export: transformers on
# qwen2.5-coder-1.5b:hf-bf16 (quantrack.models.hfexport) against llama.cpp on the same weights, on the same token ids.
#   scripts/gpu/qwen-export-check.sh [OUTDIR]       (on the node, after scripts/gpu/node.sh hfmodel qwen2.5-coder-1.5b)
#
# Tolerance, stated before looking: (1) tokenization: the export's tokenizer.json and llama.cpp's tokenizer on the GGUF
# give identical ids on every KL text (0 mismatches); (2) logits: transformers in float32 on the GPU vs llama.cpp F32
# on the CPU, both on exactly the bf16 values the export wrote (xengine.py f32-gguf), over 4,000 scored positions:
# top-1 agreement >= 99.0% and mean KL(transformers || llama.cpp) <= 1e-3 nats. Anything else is a failed export
# (wrong bias, wrong row order, wrong head) and the GPU studies' bf16 baseline is not the GGUF's model.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/root/qwen-export-check}
export QUANTRACK_CACHE=${QUANTRACK_CACHE:-/root/qt-cache} PYTHONUNBUFFERED=1
py() { (cd "$here" && PYTHONPATH="/tmp/qt-site:$here" python3 "$@"); }
mkdir -p "$out"
hf=$(py -c "from quantrack.models.ref import cached_path; print(cached_path('qwen2.5-coder-1.5b:hf-bf16'))")
src=$(py -c "from quantrack.models.ref import cached_path; print(cached_path('qwen2.5-coder-1.5b:Q4_K_M'))")
[ "$hf" != None ] && [ "$src" != None ] || { echo "run scripts/gpu/node.sh hfmodel qwen2.5-coder-1.5b first"; exit 2; }
x="scripts/gpu/xengine.py"
py $x ids "$out/ids.json" --tokenizer "$hf" --tokens 4000
py $x f32-gguf "$src" "$out/export-f32.gguf"
# (1) the same ids from llama.cpp's tokenizer (llama-server /tokenize on the GGUF, 127.0.0.1)
py $x tok-check "$hf" "$src" "$out/tokenize.json" --tokens 4000
# (2) the distributions
py $x hf "$hf" "$out/ids.json" "$out/transformers-fp32.json" --dtype float32
py $x serve-dump llamacpp "$out/export-f32.gguf" "$out/ids.json" "$out/llamacpp-f32.json"
py $x compare "$out/transformers-fp32.json" "$out/llamacpp-f32.json" --out "$out/compare.json"
py -c "import json; r = json.load(open('$out/compare.json')); t = json.load(open('$out/tokenize.json')); \
ok = t['differ'] == 0 and r['top1_agree'] >= 0.99 and r['kl_mean'] <= 1e-3; \
print('PASS' if ok else 'FAIL', f\"tokenization {t['differ']}/{t['pieces']} differ (0 allowed); top-1 {r['top1_agree']:.4f} (>= 0.99); mean KL {r['kl_mean']:.3g} (<= 1e-3)\")"

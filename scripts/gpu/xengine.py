#!/usr/bin/env python3
"""Cross-engine fidelity floor: the same bf16 weights and the same token ids through several engines.

Each engine's top-k log-probabilities at every scored position are dumped to a JSON file; any two dumps are then
compared with quantrack's own KL estimator (quantrack.accuracy.kl.position_stats / summarize). The KL between two
engines serving identical weights is the floor below which an arm's KL is not a quantization effect.

  xengine.py ids OUT.json --tokenizer DIR [--tokens 4000]       token ids of the KL texts (GSM8K q + answer)
  xengine.py serve-dump vllm|sglang|llamacpp MODEL IDS OUT [--util U] [--arg A]... [--env K=V]... [--binary B]
                                                                 start a bf16 server on DIR (quantrack's adapter),
                                                                 dump top-k, stop it
  xengine.py dump vllm|sglang|llamacpp URL IDS OUT               dump top-k from a running server
  xengine.py hf DIR IDS OUT [--dtype float32]                    transformers on the GPU (or CPU), same ids
  xengine.py f32-gguf SRC.gguf OUT.gguf                          the GGUF with every tensor replaced by exactly the
                                                                 bf16 values the export writes, stored F32, in
                                                                 llama.cpp's row order (for llama.cpp on the CPU)
  xengine.py compare BASE.json CAND.json [--out R.json]         KL(BASE || CAND), top-1 agreement, bootstrap CI
  xengine.py tok-check DIR MODEL.gguf OUT.json [--tokens 4000]  the export's tokenizer.json vs llama.cpp's /tokenize on
                                                                 the GGUF, on the KL texts: ids that differ
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

TOP_K = 20


def cmd_ids(args: argparse.Namespace) -> None:
    from tokenizers import Tokenizer

    from quantrack.accuracy.texts import default_texts

    tok = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))
    texts, done = [], 0
    for t in default_texts():
        if done >= args.tokens:
            break
        p = tok.encode(t.prompt, add_special_tokens=False).ids
        c = tok.encode(t.continuation, add_special_tokens=False).ids[: args.tokens - done]
        if not p or not c:
            continue
        texts.append({"source": t.source, "ids": p + c, "start": len(p)})
        done += len(c)
    Path(args.out).write_text(json.dumps({"tokenizer": str(args.tokenizer), "positions": done, "texts": texts}))
    print(f"{len(texts)} texts, {done} scored positions -> {args.out}")


def _dump(engine: str, url: str, ids_path: str, out: str, meta: dict[str, Any]) -> None:
    from quantrack.accuracy.kl import _Server

    data = json.loads(Path(ids_path).read_text())
    srv = _Server("engine", url, engine, 300.0)
    t0 = time.perf_counter()
    rows = []
    try:
        for t in data["texts"]:
            top = srv.score(t["ids"], t["start"], TOP_K)
            rows.append({"source": t["source"], "top": [{str(k): v for k, v in d.items()} for d in top]})
    finally:
        srv.close()
    meta.update({"engine": engine, "positions": sum(len(r["top"]) for r in rows), "top_k": TOP_K,
                 "wall_s": round(time.perf_counter() - t0, 2)})
    Path(out).write_text(json.dumps({"meta": meta, "texts": rows}))
    print(f"{engine}: {meta['positions']} positions in {meta['wall_s']} s -> {out}")


def cmd_dump(args: argparse.Namespace) -> None:
    _dump(args.engine, args.url, args.ids, args.out, {"url": args.url})


def cmd_serve_dump(args: argparse.Namespace) -> None:
    from quantrack.arms import Arm
    from quantrack.engines.lifecycle import server_for_arm

    env = dict(e.split("=", 1) for e in args.env)
    arm = Arm(name=f"xengine-{args.engine}", weights="bf16", baseline=True,
              model=args.model if args.engine == "llamacpp" else None)
    srv = server_for_arm(args.engine, args.model, arm, context_len=2048, util=args.util, extra_args=tuple(args.arg),
                         env=env, binary=args.binary, log_path=str(Path(args.out).with_suffix(".server.log")),
                         startup_timeout=900)
    with srv:
        print(f"{args.engine} bf16 ready at {srv.base_url}", flush=True)
        _dump(args.engine, srv.base_url, args.ids, args.out, {"model": args.model, "args": list(args.arg)})


def cmd_hf(args: argparse.Namespace) -> None:
    import torch
    import transformers

    data = json.loads(Path(args.ids).read_text())
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    kw = {"dtype": dtype} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": dtype}
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, **kw).to(dev).eval()
    t0 = time.perf_counter()
    rows = []
    with torch.no_grad():
        for t in data["texts"]:
            ids = torch.tensor([t["ids"]], device=dev)
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            # position p's distribution predicts ids[p]; quantrack scores positions start..len-1
            top = torch.topk(logp[t["start"] - 1: len(t["ids"]) - 1], TOP_K, dim=-1)
            rows.append({"source": t["source"], "top": [
                {str(int(i)): float(v) for i, v in zip(ix.tolist(), vx.tolist(), strict=True)}
                for ix, vx in zip(top.indices, top.values, strict=True)]})
    meta = {"engine": f"transformers {transformers.__version__} ({args.dtype} compute on {dev}, torch "
                      f"{torch.__version__})", "positions": sum(len(r["top"]) for r in rows), "top_k": TOP_K,
            "wall_s": round(time.perf_counter() - t0, 2), "model": args.model}
    Path(args.out).write_text(json.dumps({"meta": meta, "texts": rows}))
    print(f"{meta['engine']}: {meta['positions']} positions in {meta['wall_s']} s -> {args.out}")


def cmd_f32_gguf(args: argparse.Namespace) -> None:
    import gguf
    import numpy as np

    from quantrack.models import hfexport

    r = gguf.GGUFReader(args.src)
    w = gguf.GGUFWriter(args.out, str(r.fields["general.architecture"].contents()))
    for name, fld in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            w.add_uint32(name, int(gguf.LlamaFileType.ALL_F32))
            continue
        vt = fld.types[0]
        sub = fld.types[1] if vt == gguf.GGUFValueType.ARRAY and len(fld.types) > 1 else None
        w.add_key_value(name, fld.contents(), vt, sub_type=sub)
    for t in r.tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        v = hfexport.bf16_to_f32(hfexport.bf16_bits(v))  # the export's values; Q/K stay in GGUF row order
        w.add_tensor(t.name, np.ascontiguousarray(v), raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{len(r.tensors)} tensors -> {args.out}")


def compare(base_path: str, cand_path: str) -> dict[str, Any]:
    from quantrack.accuracy.kl import position_stats, summarize

    base, cand = json.loads(Path(base_path).read_text()), json.loads(Path(cand_path).read_text())
    cand_by = {r["source"]: r["top"] for r in cand["texts"]}
    groups, sources = [], []
    for r in base["texts"]:
        if r["source"] not in cand_by:
            continue
        b = [{int(k): v for k, v in d.items()} for d in r["top"]]
        c = [{int(k): v for k, v in d.items()} for d in cand_by[r["source"]]]
        n = min(len(b), len(c))
        if n:
            groups.append([position_stats(x, y) for x, y in zip(b[:n], c[:n], strict=True)])
            sources.append(r["source"])
    res = summarize(groups, engine="cross-engine", baseline_url=base["meta"]["engine"],
                    candidate_url=cand["meta"]["engine"], top_k=TOP_K, sources=sources,
                    texts="GSM8K test (question + reference answer), file order; identical token ids").to_dict()
    res.pop("per_text", None)
    return res


def cmd_compare(args: argparse.Namespace) -> None:
    res = compare(args.base, args.cand)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    ci = res.get("ci") or {}
    print(f"{res['baseline_url']}  ||  {res['candidate_url']}: {res['n_positions']} positions, "
          f"top-1 agree {res['top1_agree'] * 100:.2f}% {ci.get('top1_agree')}, KL mean {res['kl_mean']:.3g} "
          f"{ci.get('kl_mean')}, median {res['kl_median']:.3g}, p99 {res['kl_p99']:.3g}, "
          f"lower bound {res['kl_lower_mean']:.3g}, top-{TOP_K} overlap {res['topk_overlap']:.3f}")


def cmd_tok_check(args: argparse.Namespace) -> None:
    import httpx
    from tokenizers import Tokenizer

    from quantrack.accuracy.texts import default_texts
    from quantrack.arms import Arm
    from quantrack.engines.lifecycle import server_for_arm

    tok = Tokenizer.from_file(str(Path(args.dir) / "tokenizer.json"))
    arm = Arm(name="tok-check", weights="f32", baseline=True, model=args.gguf)
    srv = server_for_arm("llamacpp", args.gguf, arm, context_len=2048, log_path=str(Path(args.out).with_suffix(
        ".server.log")), startup_timeout=900)
    pieces, differ, done, first = 0, 0, 0, None
    with srv:
        for t in default_texts():
            if done >= args.tokens:
                break
            for text in (t.prompt, t.continuation):
                want = tok.encode(text, add_special_tokens=False).ids
                got = httpx.post(f"{srv.base_url}/tokenize", json={"content": text, "add_special": False},
                                 timeout=120).json()["tokens"]
                pieces += 1
                if got != want:
                    differ += 1
                    first = first or {"source": t.source, "text": text[:200], "hf": want[:40], "llamacpp": got[:40]}
            done += len(tok.encode(t.continuation, add_special_tokens=False).ids)
    res = {"pieces": pieces, "differ": differ, "first_difference": first, "tokenizer": str(args.dir),
           "gguf": args.gguf}
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"tokenization: {differ} of {pieces} strings differ (tolerance 0) -> {args.out}")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ids")
    p.add_argument("out")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--tokens", type=int, default=4000)
    p.set_defaults(fn=cmd_ids)
    p = sub.add_parser("dump")
    p.add_argument("engine", choices=["vllm", "sglang", "llamacpp"])
    for a in ("url", "ids", "out"):
        p.add_argument(a)
    p.set_defaults(fn=cmd_dump)
    p = sub.add_parser("serve-dump")
    p.add_argument("engine", choices=["vllm", "sglang", "llamacpp"])
    for a in ("model", "ids", "out"):
        p.add_argument(a)
    p.add_argument("--util", type=float, default=None)
    p.add_argument("--arg", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--binary", default=None)
    p.set_defaults(fn=cmd_serve_dump)
    p = sub.add_parser("hf")
    for a in ("model", "ids", "out"):
        p.add_argument(a)
    p.add_argument("--dtype", default="float32")
    p.set_defaults(fn=cmd_hf)
    p = sub.add_parser("f32-gguf")
    p.add_argument("src")
    p.add_argument("out")
    p.set_defaults(fn=cmd_f32_gguf)
    p = sub.add_parser("compare")
    p.add_argument("base")
    p.add_argument("cand")
    p.add_argument("--out", default=None)
    p.set_defaults(fn=cmd_compare)
    p = sub.add_parser("tok-check")
    for a in ("dir", "gguf", "out"):
        p.add_argument(a)
    p.add_argument("--tokens", type=int, default=4000)
    p.set_defaults(fn=cmd_tok_check)
    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main(sys.argv[1:])

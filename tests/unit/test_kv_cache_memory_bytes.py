"""vLLM's --kv-cache-memory-bytes in a study's engine args reaches the runner's capacity prediction, and `plan` /
`preflight` take the flag (vLLM only).

The real case: the H200 SmolLM2 vLLM study (examples/gpu/h200-smollm2-vllm.toml) ran with
`--kv-cache-memory-bytes 4294967296`; its store (docs/gpu/h200-smollm2-store.tar.gz) holds the servers' logs,
whose `GPU KV cache size: N tokens` lines are vLLM's own figure (measured). The prediction is made from the study
file, and compared with those logs (not with the prediction the old run logged)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from quantrack.cli import main
from quantrack.engines import get_adapter
from quantrack.errors import BadInput
from quantrack.hardware.capacity import kv_cache_memory_bytes_in
from quantrack.run.steps import step_predict
from quantrack.study import load_study

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "examples" / "gpu" / "h200-smollm2-vllm.toml"
STORE = REPO / "docs" / "gpu" / "h200-smollm2-store.tar.gz"


def _logged_kv_tokens() -> dict[str, set[int]]:
    """arm -> vLLM's `GPU KV cache size` from each server log in the store (logs that reached it)."""
    out: dict[str, set[int]] = {}
    with tarfile.open(STORE) as tar:
        for m in tar.getmembers():
            if "/artifacts/server/" in m.name and m.name.endswith("-server.log"):
                f = tar.extractfile(m)
                assert f is not None
                rep = get_adapter("vllm").parse_log(f.read().decode("utf-8", "replace").splitlines())
                if rep.kv_cache_tokens is not None:
                    out.setdefault(m.name.rsplit("/", 1)[1].removesuffix("-server.log"), set()).add(
                        rep.kv_cache_tokens)
    return out


def test_study_prediction_equals_the_logged_kv_tokens() -> None:
    study = load_study(STUDY)
    logged = _logged_kv_tokens()
    assert set(logged) == {a.name for a in study.arms}, logged
    for arm in study.arms:
        pred = step_predict(study, arm, {"gpu_name": "NVIDIA H200"})
        assert logged[arm.name] == {pred.engine_tokens}, (arm.name, pred.engine_tokens, logged[arm.name])
    assert sorted({t for v in logged.values() for t in v}) == [186_400, 372_816]


@pytest.mark.parametrize(("args", "want"), [
    ([], None),
    (["--attention-backend", "FLASH_ATTN", "--kv-cache-memory-bytes", "4294967296"], 4294967296),
    (["--kv-cache-memory-bytes=1073741824"], 1073741824),
    (["--kv-cache-memory-bytes", "1", "--kv-cache-memory-bytes=2"], 2),  # argparse: the last one wins
])
def test_flag_read_from_args(args: list[str], want: int | None) -> None:
    assert kv_cache_memory_bytes_in(args) == want


@pytest.mark.parametrize("args", [["--kv-cache-memory-bytes"], ["--kv-cache-memory-bytes=4G"],
                                  ["--kv-cache-memory-bytes", "0"]])
def test_unreadable_flag_is_refused(args: list[str]) -> None:
    with pytest.raises(BadInput, match="kv-cache-memory-bytes"):
        kv_cache_memory_bytes_in(args)


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = main(argv)
        code = 0 if rc is None else int(rc)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_plan_and_preflight_take_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", "SmolLM2-135M", "--gpu", "H200", "--util", "0.08", "--context-len", "2048",
            "--arm", "bf16", "--arm", "fp8-kv"]
    code, out, err = _cli(["plan", *base, "--engine", "vllm", "--kv-cache-memory-bytes", "4294967296",
                           "--format", "json"], capsys)
    assert code == 0, err
    assert [r["engine_tokens"] for r in json.loads(out)] == [186_400, 372_816], out
    code, out, err = _cli(["preflight", *base, "--kv-cache-memory-bytes", "4294967296", "--format", "json"], capsys)
    assert code == 0, err
    res = json.loads(out)["results"]
    assert [r["capacity"]["engine_tokens"] for r in res] == [186_400, 372_816]
    assert "--kv-cache-memory-bytes 4294967296" in " ".join(res[0]["launch"])  # the launch line serves it


@pytest.mark.parametrize("cmd", ["plan", "preflight"])
def test_flag_refused_for_other_engines(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = _cli([cmd, "--model", "SmolLM2-135M", "--gpu", "H200", "--arm", "bf16", "--engine", "sglang",
                            "--kv-cache-memory-bytes", "4294967296"], capsys)
    assert code == 2 and "vLLM's setting" in err and "Traceback" not in err, err

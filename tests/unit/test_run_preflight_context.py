"""`quantrack run`'s preflight step rejects a context the model or the memory cannot hold, as `quantrack
preflight` does (preflight.context_verdicts), before any engine is started: the arm is logged rejected
(KILLED, quantrack.verdict = reject, the rule ids), exit 3, no server log in the work folder."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from quantrack.cli import main

STUDY = """
name = "ctx-absurd-{engine}"
context_len = 2000000000
[model]
name = "SmolLM2-135M"
path = "/nonexistent/smollm2"
[engine]
kind = "{engine}"
[gpu]
name = "{gpu}"
[[arms]]
name = "a"
weights = "{weights}"
baseline = true
"""


@pytest.mark.parametrize(("engine", "gpu", "weights", "rules"), [
    ("vllm", "H200", "bf16", "context-exceeds-kv,context-exceeds-model"),
    ("llamacpp", "cpu", "q8_0", "context-exceeds-memory,context-exceeds-model"),  # the model maximum: a warning
])
@pytest.mark.slow  # a real MLflow store or subprocess: seconds each (not in --fast)
def test_absurd_context_is_rejected_before_serving(engine: str, gpu: str, weights: str, rules: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "s.toml"
    study.write_text(STUDY.format(engine=engine, gpu=gpu, weights=weights), encoding="utf-8")
    db, work = tmp_path / "mlflow.db", tmp_path / "work"
    try:
        code = main(["run", str(study), "--tracking-uri", f"sqlite:///{db}", "--workdir", str(work)])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 3, err
    assert "[a] preflight: reject; context-exceeds-" in err and "starting" not in err, err
    assert not list(work.glob("*-server.log"))  # no engine started
    con = sqlite3.connect(db)
    try:
        (run_id, status), = con.execute("SELECT r.run_uuid, r.status FROM runs r JOIN tags t ON t.run_uuid = "
                                        "r.run_uuid WHERE t.key = 'quantrack.role' AND t.value = 'arm'").fetchall()
        tags = dict(con.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,)).fetchall())
    finally:
        con.close()
    assert status == "KILLED" and tags["quantrack.verdict"] == "reject", tags
    assert ",".join(sorted(r for r in tags["quantrack.rule_ids"].split(",") if r.startswith("context-"))) == rules

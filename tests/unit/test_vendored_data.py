"""The real data vendored in tests/data/real is unchanged: every file matches the SHA-256 in its README."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def test_every_vendored_file_matches_its_recorded_sha256() -> None:
    text = (REAL / "README.md").read_text(encoding="utf-8")
    recorded = {path: digest for digest, path in re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.MULTILINE)}
    present = {str(p.relative_to(REAL)) for p in REAL.rglob("*") if p.is_file() and p.name != "README.md"}
    assert present == set(recorded)
    for path, digest in recorded.items():
        assert hashlib.sha256((REAL / path).read_bytes()).hexdigest() == digest, path


def test_gsm8k_train_decompresses_to_the_upstream_file(real_data: Path) -> None:
    from quantrack.accuracy.gsm8k import TRAIN_SHA256

    train = (real_data / "gsm8k" / "train.jsonl").read_bytes()
    assert len(train) == 4_166_206 and hashlib.sha256(train).hexdigest() == TRAIN_SHA256

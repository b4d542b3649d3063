"""Issue #43: a credential inside a tracking URI — in the query string (``?token=``, ``?access_token=``,
``?key=`` … URL-encoded too) or as the user name (``http://TOKEN@host``) — is never printed and never written
to the spool. Each spelling is logged to an unreachable server (the run is spooled), then ``sync`` is run
against the same URI (its failure line names the server); the console, every spooled file and the redaction of
free text are searched for the token in every form it could take."""

from __future__ import annotations

import json
import socket
from urllib.parse import unquote, unquote_plus

import pytest

from quantrack.cli import main
from quantrack.redact import forget_secrets, redact_text, strip_credentials, uri_secrets
from quantrack.store.records import RunRecord
from quantrack.store.tracking import Tracker, spool_dir

TOK = "qt" + "Zx81Kp0wLm4RvT7s"  # planted; never a real credential


def _closed() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


SPELLINGS = [
    ("query token", "http://{h}/?token={t}"),
    ("query access_token", "http://{h}/?access_token={t}"),
    ("query key", "http://{h}/?key={t}"),
    ("query api_key", "http://{h}/?api_key={t}"),
    ("query apikey after another", "http://{h}/?x=1&apikey={t}"),
    ("query upper TOKEN", "http://{h}/?TOKEN={t}"),
    ("query ; separator", "http://{h}/?a=b;token={t}"),
    ("query before a fragment", "https://{h}/?token={t}#frag"),
    ("query encoded name", "http://{h}/?access%5Ftoken={t}"),
    ("query encoded value", "http://{h}/?token={t}%2B%2F"),
    ("query plus in value", "http://{h}/?auth_token={t}+x"),
    ("query presigned signature", "https://{h}/?X-Amz-Signature={t}"),
    ("query password", "http://{h}/?password={t}"),
    ("token as user", "http://{t}@{h}"),
    ("token as user, empty password", "http://{t}:@{h}"),
    ("token as encoded user", "http://{t}%21@{h}"),
    ("user and password", "http://alice:{t}@{h}"),
    ("encoded password", "http://alice:{t}%40x@{h}"),
]


def _forms(uri_part: str) -> set[str]:
    return {uri_part, unquote(uri_part), unquote_plus(uri_part)}


@pytest.fixture(autouse=True)
def _forget() -> None:
    forget_secrets()


@pytest.mark.parametrize("template", [t for _, t in SPELLINGS], ids=[i for i, _ in SPELLINGS])
def test_a_uri_credential_is_nowhere(template: str, capsys: pytest.CaptureFixture[str]) -> None:
    host = _closed()
    uri = template.format(h=host, t=TOK)
    rec = RunRecord(experiment="exp", run_name="arm")
    rec.metric("tpot_ms", 3.5)
    rec.tag("note", f"logged to {uri}")  # the URI echoed into a tag: scrubbed too
    logged = Tracker(uri, "exp").log(rec)
    assert logged.spooled
    try:
        main(["sync", "--tracking-uri", uri])
    except SystemExit:
        pass
    out = capsys.readouterr()
    console = out.out + out.err
    assert "unreachable" in console or "spool" in console
    spooled = "".join(p.read_text(errors="replace") for p in spool_dir().rglob("*") if p.is_file())
    target = json.loads(next(spool_dir().rglob("record.json")).read_text())["target_uri"]
    for text in (console, spooled, target, redact_text(f"error: cannot reach {uri}"), strip_credentials(uri)):
        for form in _forms(TOK) | {TOK + "+x", TOK + "!", TOK + "@x"}:
            assert form not in text, (form, text[:300])
    assert host in target  # the URI itself is kept: only the credential goes


def test_uri_secrets_decodes_and_strip_keeps_the_rest() -> None:
    assert uri_secrets("http://h/?token=a%2Bbcd&x=1") == ["a%2Bbcd", "a+bcd"]
    assert strip_credentials("http://h:5000/?token=abcd&x=1") == "http://h:5000/?x=1"
    assert strip_credentials("http://h/?x=1&key=abcd&y=2") == "http://h/?x=1&y=2"
    assert strip_credentials("http://TOKEN@h:5000/api") == "http://h:5000/api"
    # not secrets: ordinary parameters and user names of other schemes stay
    assert redact_text("http://h/?max_tokens=5&model=x") == "http://h/?max_tokens=5&model=x"
    assert redact_text("ssh://git@github.com/x") == "ssh://git@github.com/x"

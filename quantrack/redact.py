"""Secret redaction for everything quantrack records: params, tags, launch commands and server logs.

Secrets are API keys (``--api-key``), bearer tokens (``Authorization``), Hugging Face tokens (``HF_TOKEN``)
and any environment variable named ``*_TOKEN`` / ``*_KEY`` / ``*_SECRET`` / ``*PASSWORD*``. Two layers:

1. by *name*: a flag, env var, mapping key or ``key=value`` whose name looks secret has its value replaced;
2. by *value*: literal secret values the caller knows (the env it passed to a server, the API key it
   used) are replaced wherever they appear, so a secret echoed by an engine in an odd format is caught too.
   Besides the values a caller passes, every text redaction also scrubs the values the *process* knows:
   secret-named variables of ``os.environ`` (``HF_TOKEN``, ``*_API_KEY``, ``MLFLOW_TRACKING_PASSWORD``...),
   passwords inside URLs found there (``HTTPS_PROXY=http://u:p@host``) and every value registered with
   :func:`register_secret` (``--api-key``, tracking-URI credentials, values hidden by :func:`redact_argv`).
3. ``user:password@`` inside any URL keeps the user and loses the password.

JSON stays JSON: a quoted value is replaced inside the same quotes (``"HF_TOKEN": "[REDACTED]"``).
:class:`RedactingStream` wraps ``sys.stdout``/``sys.stderr`` (the CLI installs it) so nothing printed by
quantrack, or by a library it calls (MLflow's "View run at" line), carries a known secret.

``quantrack.store.tracking`` applies these before anything reaches a store or the spool.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

REDACTED = "[REDACTED]"

# Flags whose *next* argument (or ``=value``) is a secret.
SECRET_FLAGS = ("--api-key", "--api_key", "--hf-token", "--hf_token", "--token", "--auth-token",
                "--admin-api-key", "--password", "--secret", "--access-token")

_SECRET_NAME = re.compile(
    r"(?:^|[_\-.])(?:token|key|secret|password|passwd|credentials?)$"
    r"|^(?:authorization|api[_\-]?key|hf[_\-]?token|password|secret|token|bearer)$"
    r"|password|secret|apikey|api_key|api-key|access_token|auth_token",
    re.IGNORECASE,
)
# Names that end in KEY/TOKEN but are not secrets (measured figures and config switches).
_NOT_SECRET = re.compile(r"^(?:kv[_\-]?cache.*|.*_tokens?_(?:count|limit)|max_tokens?|num_tokens?|.*tokens)$",
                         re.IGNORECASE)

# Patterns inside free text (server logs, argv strings, repr'd dicts).
_TEXT_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization: Bearer xxx / Authorization: xxx
    (re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?:bearer\s+)?[^\s\"',}]+"), r"\1" + REDACTED),
    (re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=\-]{4,}"), r"\1" + REDACTED),
    # --api-key xxx / --api-key=xxx (and the other secret flags)
    (re.compile(r"(?i)(--(?:api[-_]key|hf[-_]token|token|auth[-_]token|admin[-_]api[-_]key|password"
                r"|access[-_]token)(?:=|\s+))(?!\[REDACTED\])(?:(['\"])(?:(?!\2).)*\2|[^\s'\",;}\]]+)"), r"\1\2" + REDACTED + r"\2"),
    # --secret VALUE, but not `--secret NAME` (SkyPilot's flag takes an environment variable's name)
    (re.compile(r"(?i)(--secret(?:=|\s+))(?!(?-i:[A-Z_][A-Z0-9_]*)(?:\s|$))(?!\[REDACTED\])(?:(['\"])(?:(?!\2).)*\2|[^\s'\",;}\]]+)"),
     r"\1\2" + REDACTED + r"\2"),
    # 'api_key': 'xxx' / "api_key": ["xxx"] / api_key='xxx' (engines print their args as dict reprs);
    # the value keeps its own quotes so JSON stays JSON
    (re.compile(r"(?i)([\"']?[A-Za-z0-9_]*(?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*\[?\s*)"
                r"(['\"])(?:(?!\2).)*\2"), r"\1\2" + REDACTED + r"\2"),
    # an argv inside a list (TOML/JSON/Python): ["--api-key", "xxx"] / ['--token', 'xxx']
    (re.compile(r"(?i)(['\"]--(?:api[-_]key|hf[-_]token|token|auth[-_]token|admin[-_]api[-_]key|password|secret"
                r"|access[-_]token)['\"]\s*,\s*)(['\"])(?:(?!\2).)*\2"), r"\1\2" + REDACTED + r"\2"),
    # scheme://user:password@host -> scheme://user:[REDACTED]@host
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://[^\s:/@'\"]+:)[^\s@/'\"]+(@)"), r"\1" + REDACTED + r"\2"),
    # ENV_NAME=value for secret-named variables (HF_TOKEN=..., OPENAI_API_KEY=...)
    (re.compile(r"\b([A-Z][A-Z0-9_]*(?:_TOKEN|_KEY|_SECRET|PASSWORD)=)(?!\[REDACTED\])(?:(['\"])(?:(?!\2).)*\2|[^\s'\",;}\]]+)"),
     r"\1\2" + REDACTED + r"\2"),
    # Well-known token shapes, wherever they appear.
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}\b"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), REDACTED),
)


def is_secret_name(name: str) -> bool:
    """True for names whose values must never be recorded (``HF_TOKEN``, ``api_key``, ``Authorization``...)."""
    n = name.strip().lstrip("-")
    if not n or _NOT_SECRET.match(n):
        return False
    return bool(_SECRET_NAME.search(n))


_REGISTERED: set[str] = set()
_URL_PASSWORD = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^\s:/@'\"]+:([^\s@/'\"]+)@")
# env values this short or this plain are switches, not secrets (HF_HUB_DISABLE_TOKEN=1, SOME_KEY=true)
_PLAIN_VALUE = re.compile(r"^(?:\d+|true|false|yes|no|on|off|none|null)$", re.IGNORECASE)
_MIN_SECRET = 4
_MIN_ENV_SECRET = 6


def register_secret(*values: str | None) -> None:
    """Remember literal secret values (an ``--api-key``, a URI password) for every later redaction."""
    for v in values:
        if v and len(v) >= _MIN_SECRET and v != REDACTED:
            _REGISTERED.add(v)
            if "%" in v:  # also the decoded form of a URL-quoted password
                from urllib.parse import unquote

                if len(unquote(v)) >= _MIN_SECRET:
                    _REGISTERED.add(unquote(v))


def forget_secrets() -> None:
    """Drop registered values (tests; a long-lived process between studies)."""
    _REGISTERED.clear()


def strip_credentials(url: str) -> str:
    """``scheme://user:password@host/...`` -> ``scheme://host/...`` (what may be written down of a URI)."""
    return re.sub(r"(?i)^([a-z][a-z0-9+.\-]*://)[^/@\s]*@", r"\1", url)


def url_passwords(text: str) -> list[str]:
    """The ``password`` parts of every ``scheme://user:password@`` in ``text``."""
    return [m.group(1) for m in _URL_PASSWORD.finditer(text) if m.group(1) != REDACTED]


def known_secrets(env: Mapping[str, str] | None = None) -> set[str]:
    """Every secret value this process knows: registered values, secret-named env values, URL passwords."""
    environ = os.environ if env is None else env
    out = set(_REGISTERED)
    for k, v in environ.items():
        if not v:
            continue
        if is_secret_name(k) and len(v) >= _MIN_ENV_SECRET and not _PLAIN_VALUE.match(v):
            out.add(v)
        if "@" in v:
            out.update(p for p in url_passwords(v) if len(p) >= _MIN_SECRET)
    return out


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Redact secrets in free text: known literal values first (the caller's and the process's), then
    the patterns above."""
    out = text
    values = {s for s in secrets if s and len(s) >= _MIN_SECRET} | known_secrets()
    values.discard(REDACTED)
    for value in sorted(values, key=len, reverse=True):
        if value in out:
            out = out.replace(value, REDACTED)
    for pattern, repl in _TEXT_PATTERNS:
        out = pattern.sub(repl, out)
    return out


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """A launch command with the values of secret flags (``--api-key X``, ``--api-key=X``) replaced."""
    known = list(secrets)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            register_secret(arg)
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("--") and "=" in arg:
            flag, _, value = arg.partition("=")
            if flag.lower() in SECRET_FLAGS or is_secret_name(flag):
                register_secret(value)
                out.append(f"{flag}={REDACTED}")
                continue
        elif arg.startswith("--") and (arg.lower() in SECRET_FLAGS or is_secret_name(arg)):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg, known))
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment with secret-named variables' values replaced."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str], extra: Iterable[str | None] = ()) -> list[str]:
    """Literal secret values to scrub from text: secret-named env values plus anything passed in ``extra``."""
    vals = [v for k, v in env.items() if is_secret_name(k) and v]
    vals += [v for v in extra if v]
    return vals


def redact_mapping(data: Mapping[str, Any], secrets: Iterable[str] = ()) -> dict[str, Any]:
    """Params/tags: a secret-named key keeps its key but loses its value; string values are scrubbed."""
    known = list(secrets)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if is_secret_name(str(key)):
            out[key] = REDACTED
        elif isinstance(value, str):
            out[key] = redact_text(value, known)
        else:
            out[key] = value
    return out


class RedactingStream(io.TextIOBase):
    """A text stream that scrubs known secrets from everything written to it (wraps stdout/stderr).

    It has no ``buffer`` attribute on purpose: click and others would write bytes past the redaction.
    """

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self._inner = inner

    @property
    def inner(self) -> TextIO:
        return self._inner

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._inner, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self._inner, "errors", None)

    def write(self, s: str) -> int:  # type: ignore[override]
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self._inner.write(redact_text(s) if s else s)
        return len(s)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return bool(getattr(self._inner, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self._inner.fileno()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False


__all__ = [
    "REDACTED",
    "RedactingStream",
    "forget_secrets",
    "is_secret_name",
    "known_secrets",
    "redact_argv",
    "redact_env",
    "redact_mapping",
    "redact_text",
    "register_secret",
    "secret_values",
    "strip_credentials",
    "url_passwords",
]

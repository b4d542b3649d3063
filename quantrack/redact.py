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
                "--admin-api-key", "--password", "--secret", "--access-token", "-hft")
# single-dash spellings (llama.cpp's ``-hft`` is ``--hf-token``; vLLM and SGLang have none for keys)
SHORT_SECRET_FLAGS = ("-hft",)

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
    (re.compile(r"(?i)((?:--(?:api[-_]key|hf[-_]token|token|auth[-_]token|admin[-_]api[-_]key|password"
                r"|access[-_]token)|(?<![\w-])-hft)(?:=|\s+))(?!\[REDACTED\])(?:(['\"])(?:(?!\2).)*\2|[^\s'\",;}\]]+)"), r"\1\2" + REDACTED + r"\2"),
    # --secret VALUE, but not `--secret NAME` (SkyPilot's flag takes an environment variable's name)
    (re.compile(r"(?i)(--secret(?:=|\s+))(?!(?-i:[A-Z_][A-Z0-9_]*)(?:\s|$))(?!\[REDACTED\])(?:(['\"])(?:(?!\2).)*\2|[^\s'\",;}\]]+)"),
     r"\1\2" + REDACTED + r"\2"),
    # 'api_key': 'xxx' / "api_key": ["xxx"] / api_key='xxx' (engines print their args as dict reprs);
    # the value keeps its own quotes so JSON stays JSON
    # (the name starts where a word starts: a lookbehind, so a long word is scanned once, not once per letter)
    (re.compile(r"(?i)(?<![A-Za-z0-9_])([\"']?[A-Za-z0-9_]*(?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*\[?\s*)"
                r"(['\"])(?:(?!\2).)*\2"), r"\1\2" + REDACTED + r"\2"),
    # an argv inside a list (TOML/JSON/Python): ["--api-key", "xxx"] / ['--token', 'xxx']
    (re.compile(r"(?i)(['\"](?:--(?:api[-_]key|hf[-_]token|token|auth[-_]token|admin[-_]api[-_]key|password|secret"
                r"|access[-_]token)|-hft)['\"]\s*,\s*)(['\"])(?:(?!\2).)*\2"), r"\1\2" + REDACTED + r"\2"),
    # scheme://user:password@host -> scheme://user:[REDACTED]@host
    # (the scheme starts where a run of scheme characters starts: linear on "a.a.a.a...")
    (re.compile(r"(?i)(?<![a-z0-9+.\-])([a-z][a-z0-9+.\-]*://[^\s:/@'\"]+:)[^\s/'\"]+(@)"), r"\1" + REDACTED + r"\2"),
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
_URL_PASSWORD = re.compile(r"(?i)(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*://[^\s:/@'\"]+:([^\s/'\"]+)@")
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


# query parameters whose value is a credential besides the secret-looking names (S3/GCS/Azure presigned URLs)
_QUERY_SECRET_NAMES = frozenset({"sig", "signature", "auth", "credential", "code", "x-amz-signature",
                                 "x-amz-credential", "x-goog-signature", "x-goog-credential", "sv", "se"})
# a query parameter: name (maybe %-encoded) = value, up to the next & ; # or space / quote
_QUERY_PARAM = re.compile(r"([?&;])([A-Za-z0-9_.~%\-]{1,128})=([^&;#\s'\"]*)")
# http(s)://USER@host with no password: a token used as the user name (the by-value scrub catches it elsewhere)
_URL_USER_ONLY = re.compile(r"(?i)(?<![a-z0-9+.\-])(https?://)([^\s:/@'\"?#]+)(:?)@")


def is_secret_query_name(name: str) -> bool:
    """``token``, ``access_token``, ``key``, ``api-key``, ``X-Amz-Signature``, ``%74oken`` (URL-encoded) ..."""
    from urllib.parse import unquote_plus

    n = unquote_plus(name).strip()
    return is_secret_name(n) or n.lower() in _QUERY_SECRET_NAMES or n.lower() in ("key", "apikey", "access_key")


def uri_secrets(uri: str) -> list[str]:
    """Every credential inside a URI: the password of ``user:password@``, the user of ``TOKEN@host`` (no
    password: the token is the user name), and the values of secret-named query parameters; each also
    URL-decoded (``tok%2Ben`` is ``tok+en`` on the wire)."""
    from urllib.parse import unquote, unquote_plus

    found: list[str] = list(url_passwords(uri))
    head = re.match(r"(?i)^[a-z][a-z0-9+.\-]*://([^/?#\s]*)@", uri)
    if head:
        userinfo = head.group(1)
        user, _sep, password = userinfo.partition(":")
        if not password:  # TOKEN@host or TOKEN:@host
            found.append(user)
        else:
            found.append(password)
    for m in _QUERY_PARAM.finditer(uri):
        if is_secret_query_name(m.group(2)) and m.group(3):
            found.append(m.group(3))
    out: list[str] = []
    for v in found:
        for form in (v, unquote(v), unquote_plus(v)):
            if form and form != REDACTED and form not in out:
                out.append(form)
    return out


def strip_credentials(url: str) -> str:
    """``scheme://user:password@host/...?token=X&a=1`` -> ``scheme://host/...?a=1`` (what may be written down of
    a URI): no user info at all (a token may be the user name), no secret-named query parameter."""
    out = re.sub(r"(?i)^([a-z][a-z0-9+.\-]*://)[^/\s]*@", r"\1", url)  # to the last @: a password may hold one

    def keep(m: re.Match[str]) -> str:
        return "" if is_secret_query_name(m.group(2)) else m.group(0)

    out = _QUERY_PARAM.sub(keep, out)
    if "?" not in out and "&" in out:  # the first parameter went: the next one opens the query
        out = re.sub(r"(^[^&#]*?)&", r"\1?", out, count=1)
    return out


def _hide_query_secret(m: re.Match[str]) -> str:
    if is_secret_query_name(m.group(2)) and m.group(3) and m.group(3) != REDACTED:
        return f"{m.group(1)}{m.group(2)}={REDACTED}"
    return m.group(0)


def url_passwords(text: str) -> list[str]:
    """The ``password`` parts of every ``scheme://user:password@`` in ``text``."""
    return [m.group(1) for m in _URL_PASSWORD.finditer(text) if m.group(1) != REDACTED]


def known_secrets(env: Mapping[str, str] | None = None) -> set[str]:
    """Every secret value this process knows: registered values, secret-named env values, URL passwords."""
    environ = os.environ if env is None else env
    out = set(_REGISTERED)
    # keys first, then .get(): another thread may unset a variable meanwhile (MLflow's telemetry thread pops
    # _MLFLOW_TELEMETRY_SESSION_ID), and ``environ.items()`` would raise KeyError for it (issue #31)
    for k in list(environ):
        v = environ.get(k)
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
    out = redact_values(text, secrets)
    for pattern, repl in _TEXT_PATTERNS:
        out = pattern.sub(repl, out)
    if "=" in out:  # ?token=X, &access_token=X, ;key=X inside a URL (issue #43)
        out = _QUERY_PARAM.sub(_hide_query_secret, out)
    if "@" in out:  # http://TOKEN@host
        out = _URL_USER_ONLY.sub(lambda m: m.group(0) if m.group(2) == REDACTED
                                 else f"{m.group(1)}{REDACTED}{m.group(3)}@", out)
    return out


def redact_values(text: str, secrets: Iterable[str] = ()) -> str:
    """Only the literal secret values (the caller's and the process's), no pattern: for text quantrack wrote
    itself, such as ``--help``, where ``--api-key KEY`` is documentation, not a key."""
    out = text
    values = {s for s in secrets if s and len(s) >= _MIN_SECRET} | known_secrets()
    values.discard(REDACTED)
    for value in sorted(values, key=len, reverse=True):
        if value in out:
            out = out.replace(value, REDACTED)
    return out


_VERBATIM: set[str] = set()


def verbatim(text: str) -> str:
    """Mark ``text`` (a help page quantrack rendered) to be printed without pattern redaction."""
    if len(_VERBATIM) < 256:
        _VERBATIM.add(text.rstrip("\n"))
    return text


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
        if _is_secret_flag(arg.partition("=")[0]) and "=" in arg:
            flag, _, value = arg.partition("=")
            register_secret(value)
            out.append(f"{flag}={REDACTED}")
            continue
        if _is_secret_flag(arg):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg, known))
    return out


def _is_secret_flag(arg: str) -> bool:
    if arg in SHORT_SECRET_FLAGS:
        return True
    return arg.startswith("--") and (arg.lower() in SECRET_FLAGS or is_secret_name(arg))


def argv_secret_values(argv: Iterable[str]) -> list[str]:
    """The values of the secret flags in an argv (``-hft X``, ``--hf-token X``, ``--api-key=X``), to scrub by
    value from files that hold them in another form (the study TOML's ``args = [...]``)."""
    args = list(argv)
    out: list[str] = []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if eq and _is_secret_flag(flag) and value:
            out.append(value)
        elif _is_secret_flag(arg) and i + 1 < len(args):
            out.append(args[i + 1])
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment with secret-named variables' values replaced."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


# Variables a study may set for its engine whose values are settings, not secrets. Anything else given under
# ``[engine] env`` / ``[[arms]] env`` is treated as a secret (DB_PASS, GITHUB_PAT, MY_CRED...): its value is
# hidden in launch/env.json and scrubbed by value everywhere.
_HARMLESS_ENV = re.compile(
    r"^(?:CUDA_[A-Z0-9_]*|NCCL_[A-Z0-9_]*|NVIDIA_[A-Z0-9_]*|OMP_[A-Z0-9_]*|MKL_[A-Z0-9_]*|OPENBLAS_[A-Z0-9_]*"
    r"|VLLM_[A-Z0-9_]*|SGLANG_[A-Z0-9_]*|LLAMA_ARG_[A-Z0-9_]*|GGML_[A-Z0-9_]*|PYTORCH_[A-Z0-9_]*|TORCH_[A-Z0-9_]*"
    r"|HF_HOME|HF_HUB_(?:OFFLINE|CACHE|ENABLE_HF_TRANSFER|DISABLE_[A-Z_]+|DOWNLOAD_TIMEOUT|ETAG_TIMEOUT)"
    r"|HF_DATASETS_[A-Z0-9_]*|TRANSFORMERS_[A-Z0-9_]*|TOKENIZERS_PARALLELISM|RAY_[A-Z0-9_]*|TRITON_[A-Z0-9_]*"
    r"|PATH|LD_LIBRARY_PATH|PYTHONPATH|PYTHONUNBUFFERED|TMPDIR|HOME|LANG|LC_[A-Z]+|TZ|XDG_[A-Z_]+)$")


def is_secret_env(name: str, value: str | None) -> bool:
    """A variable given to an engine by a study: secret unless its name is a known setting (and not
    secret-looking: ``VLLM_API_KEY`` is a secret)."""
    if not value:
        return False
    return is_secret_name(name) or not _HARMLESS_ENV.match(name.strip())


def redact_study_env(env: Mapping[str, str]) -> dict[str, str]:
    """A study's engine environment with every value that is not a known setting hidden."""
    return {k: (REDACTED if is_secret_env(k, v) else v) for k, v in env.items()}


def study_env_secrets(env: Mapping[str, str]) -> list[str]:
    """The values of a study's engine environment to scrub by value (not plain switches like ``1``/``true``)."""
    return [v for k, v in env.items() if is_secret_env(k, v) and len(v) >= _MIN_SECRET
            and not _PLAIN_VALUE.match(v)]


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
        if s and s.rstrip("\n") in _VERBATIM:  # help text: only known secret values, never a pattern
            self._inner.write(redact_values(s))
        else:
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
    "argv_secret_values",
    "forget_secrets",
    "is_secret_env",
    "is_secret_name",
    "known_secrets",
    "redact_argv",
    "redact_env",
    "redact_mapping",
    "redact_study_env",
    "redact_text",
    "redact_values",
    "register_secret",
    "secret_values",
    "strip_credentials",
    "study_env_secrets",
    "uri_secrets",
    "url_passwords",
    "verbatim",
]

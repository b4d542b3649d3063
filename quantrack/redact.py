"""Secret redaction for everything quantrack records: params, tags, launch commands and server logs.

Secrets are API keys (``--api-key``), bearer tokens (``Authorization``), Hugging Face tokens (``HF_TOKEN``)
and any environment variable named ``*_TOKEN`` / ``*_KEY`` / ``*_SECRET`` / ``*PASSWORD*``. Two layers:

1. by *name*: a flag, env var, mapping key or ``key=value`` whose name looks secret has its value replaced;
2. by *value*: literal secret values the caller knows (the env it passed to a server, the API key it
   used) are replaced wherever they appear, so a secret echoed by an engine in an odd format is caught too.

Pure functions, no I/O; ``quantrack.tracking`` applies them before anything reaches a store or the spool.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

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
    (re.compile(r"(?i)(--(?:api[-_]key|hf[-_]token|token|auth[-_]token|admin[-_]api[-_]key|password|secret"
                r"|access[-_]token)(?:=|\s+))(?:'[^']*'|\"[^\"]*\"|\S+)"), r"\1" + REDACTED),
    # 'api_key': 'xxx' / "api_key": ["xxx"] / api_key='xxx' (engines print their args as dict reprs)
    (re.compile(r"(?i)([\"']?[A-Za-z0-9_]*(?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*\[?\s*)"
                r"(?:'[^']*'|\"[^\"]*\")"), r"\1'" + REDACTED + "'"),
    # ENV_NAME=value for secret-named variables (HF_TOKEN=..., OPENAI_API_KEY=...)
    (re.compile(r"\b([A-Z][A-Z0-9_]*(?:_TOKEN|_KEY|_SECRET|PASSWORD)=)(?:'[^']*'|\"[^\"]*\"|\S+)"),
     r"\1" + REDACTED),
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


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Redact secrets in free text: known literal values first, then the patterns above."""
    out = text
    for value in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
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
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("--") and "=" in arg:
            flag, _, _value = arg.partition("=")
            if flag.lower() in SECRET_FLAGS or is_secret_name(flag):
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


__all__ = [
    "REDACTED",
    "is_secret_name",
    "redact_argv",
    "redact_env",
    "redact_mapping",
    "redact_text",
    "secret_values",
]

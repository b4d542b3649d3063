"""Shared, streaming helpers for the engine startup-log parsers.

Owns: stripping each engine's line prefix, reading numbers printed with thousands separators,
turning any byte soup into numbered text lines, and the bookkeeping every parser needs (first
value wins, so lines repeated by every tensor-parallel rank count once; events de-duplicated;
``not_found`` filled from the fields an engine's log is expected to give).

Each engine's own prefix formats are its adapter's ``line_prefixes`` (in its module, with the lines they were
taken from); rank tags in a prefix (TP/PP/DP/rank=) are recorded as ``*_size_seen``.
Wrappers other programs add in front (docker compose ``name  | ``, a ``[pid] ``, ``vLLM STDOUT: ``, ``> ``) are
peeled off first. Rules marked ``startup_only`` stop being searched after the first 8 MiB of a file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from quantrack.engines import registry as _engines
from quantrack.engines.base import FileSource, LinePrefix, LogEvent, LogReport

# Long lines (tqdm progress bars glued with \r, binary junk) are cut before regex matching:
# every figure quantrack reads sits well inside the first few KiB of its line.
MAX_LINE_CHARS = 16384

# What other programs put in front of an engine's own prefix (seen in public logs, tests/data/public-logs):
# docker compose "llama-1  | ", a "[47161] " process id, "vLLM STDOUT: " (unsloth), a "> " quote, "**" bold.
_WRAPPER = re.compile(r"^(?:[\w.-]{1,40} +\| |\[\d{1,9}\] |vLLM STDOUT: |> |\*\*)+")
# rank tags in process prefixes: vLLM "(VllmWorker TP1 pid=..)", "(Worker_TP3 pid=..)", "(Worker_PP6 ..)",
# "(EngineCore_DP0 ..)"; SGLang "[date TP5]", "[date DP1 TP3]"
_RANK = re.compile(r"(?:^|[_ ])(TP|PP|DP|EP)(\d{1,4})\b")
_GLOBAL_RANK = re.compile(r"\brank=(\d{1,5})\b")  # "(VllmWorker rank=3 pid=..)" (vLLM 0.8/0.9 V1)
RANK_LINES = 5000  # after this many rank-tagged lines every rank has printed its startup lines


@dataclass(frozen=True)
class Line:
    """One log line: its 1-based number, the text after the prefix, the level and rank if printed."""

    no: int
    text: str
    level: str | None = None
    rank: str | None = None
    raw: str = ""


_table: dict[str, tuple[LinePrefix, ...]] = {}
_table_generation = -1


def _prefixes() -> dict[str, tuple[LinePrefix, ...]]:
    """First character -> the registered engines' line prefixes that can start with it (registry order)."""
    global _table, _table_generation
    if _table_generation != _engines.registry_generation():
        table: dict[str, list[LinePrefix]] = {}
        for adapter in _engines.adapters():
            for prefix in adapter.line_prefixes:
                for c in prefix.first:
                    table.setdefault(c, []).append(prefix)
        _table, _table_generation = {c: tuple(v) for c, v in table.items()}, _engines.registry_generation()
    return _table


def strip_prefix(line: str) -> tuple[str, str | None, str | None]:
    """Return (text, level, rank) for one line of any registered engine (each adapter's ``line_prefixes``);
    unknown prefixes pass through."""
    if not line:
        return "", None, None
    table = _table if _table_generation == _engines.registry_generation() else _prefixes()
    c = line[0]
    if c in "[>*vV" or " | " in line[:48]:
        w = _WRAPPER.match(line)
        if w and not any(p.pattern.match(line) for p in table.get(c, ())):
            line = line[w.end():]
            if not line:
                return "", None, None
            c = line[0]
    for prefix in table.get(c, ()):
        m = prefix.pattern.match(line)
        if m:
            groups = m.groupdict()
            level = groups.get("level")
            if level is not None and prefix.levels is not None:
                level = prefix.levels.get(level)
            rank = (groups.get("rank") or "").strip() or None
            return line[m.end():], level, rank
    # an engine's prefix further into the line, after whatever another program put in front of it (a CI timestamp,
    # Buildkite's "  | ", FastChat's "| INFO | stdout | ", TorchServe's "MODEL_LOG - "): each adapter's
    # ``embedded_prefixes``, searched in the line's head only
    for pattern in _embedded():
        e = pattern.search(line, 0, EMBEDDED_HEAD)
        if e:
            groups = e.groupdict()
            return line[e.end():], groups.get("level"), (groups.get("rank") or "").strip() or None
    return line, None, None


EMBEDDED_HEAD = 520  # how far into a line another program's wrapper may push an engine's prefix
_embedded_cache: tuple[int, tuple[re.Pattern[str], ...]] = (-1, ())


def _embedded() -> tuple[re.Pattern[str], ...]:
    global _embedded_cache
    gen = _engines.registry_generation()
    if _embedded_cache[0] != gen:
        pats = tuple(p for a in _engines.adapters() for p in getattr(a, "embedded_prefixes", ()))
        _embedded_cache = (gen, pats)
    return _embedded_cache[1]


def iter_raw(source: Iterable[str] | Iterable[bytes] | str | bytes) -> Iterator[tuple[int, str]]:
    """(line number, raw line) from text, bytes, a file object or any iterable of lines.

    Never raises on content: undecodable bytes are replaced, NULs dropped, over-long lines cut.
    Splits on "\\n" only (like ``grep -n``), so line numbers match the file's.
    """
    chunks: Iterable[str | bytes] = [source] if isinstance(source, (str, bytes)) else source
    no = 0
    for chunk in chunks:
        if isinstance(chunk, bytes):
            if len(chunk) > 4 * MAX_LINE_CHARS and b"\n" not in chunk[: 4 * MAX_LINE_CHARS]:
                chunk = chunk[: 4 * MAX_LINE_CHARS]
            chunk = chunk.decode("utf-8", errors="replace")
        elif not isinstance(chunk, str):
            chunk = str(chunk)
        body = chunk.removesuffix("\n")
        parts = body.split("\n") if "\n" in body else (body,)
        for raw in parts:
            no += 1
            if raw.endswith("\r"):
                raw = raw.rstrip("\r")
            if "\x00" in raw:
                raw = raw.replace("\x00", "")
            if len(raw) > MAX_LINE_CHARS:
                raw = raw[:MAX_LINE_CHARS]
            yield no, raw


# ANSI colour codes, as bytes (ESC [ ... m) or as a thread shows them in caret notation (^[[0;36m): vLLM colours its
# prefix (tests/data/wild3/vllm-33297-...), llama.cpp its level letters
_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;]*m")


def make_line(no: int, raw: str) -> Line:
    if "[" in raw and ("\x1b[" in raw or "^[[" in raw):
        raw = _ANSI.sub("", raw)
    text, level, rank = strip_prefix(raw)
    return Line(no, text, level, rank, raw)


def iter_lines(source: Iterable[str] | Iterable[bytes] | str | bytes) -> Iterator[Line]:
    """Numbered, prefix-stripped lines (see ``iter_raw``)."""
    for no, raw in iter_raw(source):
        yield make_line(no, raw)


BLOCK_BYTES = 4 * 1024 * 1024


Handler = Callable[["ReportBuilder", Line], None]
Done = Callable[["ReportBuilder"], bool]
# (keyword, handler) or (keyword, handler, done): ``done(builder)`` True = the rule has what it needs
# (first value wins), so later blocks of a big file stop searching for its keyword.
RuleSpec = tuple[str, Handler] | tuple[str, Handler, Done]


def startup_only(blocks: int = 2, *names: str) -> Done:
    """A rule for lines printed at start-up only (command lines, rank layout, the profile run, start-up errors):
    searched in the first ``blocks`` 4 MiB blocks of a file (or until ``names`` are filled), so a long serving log
    does not pay for it on every block."""
    filled = done_when(*names) if names else None

    def check(b: ReportBuilder) -> bool:
        return b.blocks >= blocks or (filled is not None and filled(b))
    return check


def done_when(*names: str) -> Done:
    """A rule is done once every named report field (or ``extra`` key) has a value."""
    def check(b: ReportBuilder) -> bool:
        r = b.report
        return all((getattr(r, n, None) if hasattr(r, n) else r.extra.get(n)) is not None for n in names)
    return check


def _dispatch(builder: ReportBuilder, rules: Sequence[RuleSpec], no: int, raw: str) -> None:
    line = make_line(no, raw)
    for rule in rules:
        if rule[0] in raw:
            rule[1](builder, line)


def _dispatch_all(builder: ReportBuilder, rules: Sequence[RuleSpec], no: int, raw: str) -> None:
    """Run ``rules`` (already the ones whose keyword the line holds) on one line."""
    line = make_line(no, raw)
    for rule in rules:
        rule[1](builder, line)


def _clean(raw_bytes: bytes) -> str:
    if len(raw_bytes) > 4 * MAX_LINE_CHARS:
        raw_bytes = raw_bytes[: 4 * MAX_LINE_CHARS]
    raw = raw_bytes.decode("utf-8", errors="replace").rstrip("\r")
    if "\x00" in raw:
        raw = raw.replace("\x00", "")
    return raw[:MAX_LINE_CHARS] if len(raw) > MAX_LINE_CHARS else raw


def _scan_file(path: str, builder: ReportBuilder, all_rules: Sequence[RuleSpec]) -> None:
    """Block scan: each keyword is searched in 4 MiB blocks at C speed; only the lines that contain
    a keyword are decoded, numbered and dispatched (in file order). Rules that are done are dropped
    before the next block."""
    rules = list(all_rules)
    line_base = 0  # lines before this block
    carry = b""
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(BLOCK_BYTES)
            eof = not chunk
            block = carry + chunk
            if not block:
                break
            if eof:
                end = len(block)
                carry = b""
            else:
                cut = block.rfind(b"\n")
                if cut < 0:  # one enormous line: keep reading until its end (or EOF)
                    carry = block
                    if len(carry) > 64 * BLOCK_BYTES:  # binary junk without newlines: keep its head only
                        carry = carry[: 4 * MAX_LINE_CHARS]
                    continue
                end = cut + 1
                carry = block[end:]
            body = block[:end]
            rules = [r for r in rules if len(r) < 3 or not r[2](builder)]  # type: ignore[misc]
            builder.blocks += 1
            keywords = sorted({r[0].encode() for r in rules})
            starts: dict[int, set[bytes]] = {}  # line start -> the keywords found in that line
            for kw in keywords:
                pos = body.find(kw)
                while pos >= 0:
                    ls = body.rfind(b"\n", 0, pos) + 1
                    starts.setdefault(ls, set()).add(kw)
                    le = body.find(b"\n", pos)
                    if le < 0:
                        break
                    pos = body.find(kw, le)
            # only the rules whose keyword the line holds run on it, in rule order (one list per keyword set)
            by_keywords: dict[frozenset[bytes], list[RuleSpec]] = {}
            prev, count = 0, 0
            for ls in sorted(starts):
                count += body.count(b"\n", prev, ls)
                prev = ls
                found = frozenset(starts[ls])
                line_rules = by_keywords.get(found)
                if line_rules is None:
                    line_rules = by_keywords[found] = [r for r in rules if r[0].encode() in found]
                le = body.find(b"\n", ls)
                _dispatch_all(builder, line_rules, line_base + count + 1,
                              _clean(body[ls: le if le >= 0 else len(body)]))
            n_lines = body.count(b"\n")
            line_base += n_lines + (0 if body.endswith(b"\n") else 1)
            if eof:
                break
    builder.lines_read = line_base


def scan(source: Iterable[str] | Iterable[bytes] | str | bytes | FileSource, builder: ReportBuilder,
         rules: Sequence[RuleSpec]) -> None:
    """Stream the log once; a line is prefix-stripped and dispatched only when one of the rules'
    keywords occurs in it. Files (FileSource) are scanned in blocks; other sources line by line."""
    if isinstance(source, FileSource):
        _scan_file(source.path, builder, rules)
        return
    keywords = sorted({r[0] for r in rules}, key=len, reverse=True)
    prefilter = re.compile("|".join(re.escape(k) for k in keywords))
    search = prefilter.search
    count = 0
    for no, raw in iter_raw(source):
        count = no
        if search(raw) is None:
            continue
        _dispatch(builder, rules, no, raw)
    builder.lines_read = count


def read_log_bytes(path: str) -> Iterator[bytes]:
    """A log file's lines as bytes, split on newline only (carriage-return progress bars stay in one line)."""
    with open(path, "rb") as fh:
        yield from fh


_NUM = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$")


def parse_number(text: str) -> float | int | None:
    """'1,945,728' -> 1945728, '118.79' -> 118.79, '8.5' -> 8.5; None for anything else."""
    s = text.strip().rstrip("x").strip()
    if not _NUM.match(s):
        return None
    s = s.replace(",", "")
    return float(s) if "." in s else int(s)


def parse_int(text: str) -> int | None:
    v = parse_number(text)
    return int(v) if v is not None else None


def parse_float(text: str) -> float | None:
    v = parse_number(text)
    return float(v) if v is not None else None


class ReportBuilder:
    """Collects figures into a LogReport: the first value of a field wins (TP ranks repeat lines),
    events are kept once per (kind, text)."""

    def __init__(self, engine: str, source: str | None, expected: Iterable[str]) -> None:
        self.report = LogReport(engine=engine, source=source)
        self._expected = tuple(expected)
        self._seen_events: set[tuple[str, str]] = set()
        self.lines_read = 0
        self._ranks: dict[str, int] = {}
        self.last_event_line = 0  # a generic "error" is not added for a line that already gave a specific event
        self.rank_lines = 0
        self.blocks = 0  # 4 MiB blocks of a file scanned so far (0 for line-by-line sources)

    def set(self, field_name: str, value: object, *, overwrite: bool = False) -> None:
        if value is None:
            return
        if overwrite or getattr(self.report, field_name) is None:
            setattr(self.report, field_name, value)

    def extra(self, key: str, value: object, *, overwrite: bool = False) -> None:
        if value is None:
            return
        if overwrite or key not in self.report.extra:
            self.report.extra[key] = value

    def event(self, bucket: str, kind: str, line: Line) -> None:
        key = (kind, line.text.strip())
        self.last_event_line = line.no
        if key in self._seen_events:
            return
        self._seen_events.add(key)
        getattr(self.report, bucket).append(LogEvent(kind=kind, line_no=line.no, line=line.raw.strip()[:2000]))

    def fallback(self, kind: str, line: Line) -> None:
        self.event("fallbacks", kind, line)

    def warning(self, kind: str, line: Line) -> None:
        self.event("warnings", kind, line)

    def error(self, kind: str, line: Line) -> None:
        self.event("errors", kind, line)

    def note_rank(self, line: Line) -> None:
        """Record the parallel ranks a line's process prefix names (the highest of each kind wins)."""
        if not line.rank:
            return
        self.rank_lines += 1
        found = _RANK.findall(line.rank)
        g = _GLOBAL_RANK.search(line.rank)
        if g:
            found.append(("RANK", g.group(1)))
        for kind, num in found:
            n = int(num)
            if n >= self._ranks.get(kind, -1):
                self._ranks[kind] = n

    def ranks_done(self) -> bool:
        """Every rank has printed (RANK_LINES rank-tagged lines), or the start-up blocks named no rank at all."""
        return self.rank_lines >= RANK_LINES or (self.blocks >= 2 and self.rank_lines == 0)

    def has_event(self, kind: str) -> bool:
        return any(k == kind for k, _ in self._seen_events)

    def finish(self) -> LogReport:
        r = self.report
        r.extra.setdefault("lines_read", self.lines_read)
        for kind, top in self._ranks.items():
            # highest rank seen + 1: the size when every rank printed (a lower bound for an excerpt)
            r.extra.setdefault("ranks_seen" if kind == "RANK" else f"{kind.lower()}_size_seen", top + 1)
        r.not_found = [f for f in self._expected if getattr(r, f) is None]
        finish_kv_scales(r)
        return r


def finish_kv_scales(report: LogReport) -> None:
    """Set ``report.kv_scales``: the report's engine's adapter reads the KV-scale lines the pass collected
    (``EngineAdapter.observe_kv_scales``, quantrack.engines.kvscale); a report of no registered engine has no
    KV-scale observation (None)."""
    from quantrack.engines.kvscale import take_lines

    seen = take_lines(report)
    known = report.engine in _engines.ENGINE_KINDS
    obs = _engines.get_adapter(report.engine).observe_kv_scales(report, seen) if known and report.engine else None
    report.kv_scales = obs.to_dict() if obs is not None else None


def torch_dtype_short(value: str) -> str:
    """'torch.bfloat16' -> 'bf16', 'torch.float8_e4m3fn' -> 'fp8_e4m3' (quantrack's spellings)."""
    v = value.strip().strip("'\"").removeprefix("torch.")
    table = {
        "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
        "float8_e4m3fn": "fp8_e4m3", "float8_e4m3fnuz": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
        "float8_e5m2fnuz": "fp8_e5m2", "uint8": "uint8", "int8": "int8",
    }
    return table.get(v, v)


def none_word(value: str) -> str:
    """The log's literal ``None`` (no quantization) becomes 'none'; quotes are removed."""
    v = value.strip().strip("'\"")
    return "none" if v in ("None", "") else v

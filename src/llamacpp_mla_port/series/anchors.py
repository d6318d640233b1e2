"""Locating a change's anchor in a file's text: the one implementation render and rebase use.

An anchor (text or regex) must match exactly once, inside the `within` scope when one is given
(from the end of the unique `within` match up to the first `within_end` after it).
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field

from llamacpp_mla_port.errors import AnchorError
from llamacpp_mla_port.series.spec import Change


def find_all(pattern: str, text: str, regex: bool, start: int = 0,
             end: int | None = None) -> list[tuple[int, int]]:
    """Every (start, end) of `pattern` in text[start:end] (overlapping plain matches too)."""
    end = len(text) if end is None else end
    if regex:
        return [(m.start(), m.end()) for m in re.compile(pattern, re.M).finditer(text, start, end)]
    out, i = [], text.find(pattern, start, end)
    while i != -1 and i + len(pattern) <= end:
        out.append((i, i + len(pattern)))
        i = text.find(pattern, i + 1, end)
    return out


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


#: a token of a source line: a string or char literal, an identifier or number, a two- or
#: three-character operator, or any other single non-blank character
_TOKEN = re.compile(r""""(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|[A-Za-z_]\w*|\d[\w.]*"""
                    r"|\.\.\.|->\*?|::|<<=|>>=|[=!<>+\-*/%&|^]=|&&|\|\||<<|>>|\+\+|--|\*\*|//|\S")


def tokens(line: str) -> list[str]:
    """The line's tokens (identifiers, numbers, literals, operators): blanks between them do
    not count, blanks inside a literal do."""
    return _TOKEN.findall(line)


def token_similarity(a: Counter, b: Counter) -> float:
    """How much two lines share their tokens, order aside: the Dice coefficient of the two
    multisets (1.0: the same tokens, reordered or respaced)."""
    total = sum(a.values()) + sum(b.values())
    return 2.0 * sum((a & b).values()) / total if total else 0.0


def nearest_lines(text: str, anchor: str, limit: int = 3) -> list[str]:
    """The lines of `text` most like the anchor's first non-blank line, as "LINE: text": scored
    by their tokens (order-insensitive: a reordered condition or a renamed variable keeps most
    of them) and by their characters (difflib), half each."""
    first = next((ln.strip() for ln in anchor.splitlines() if ln.strip()), anchor.strip())
    want = Counter(tokens(first))
    scored = []
    for no, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        by_tokens = token_similarity(want, Counter(tokens(line)))
        # quick_ratio bounds the character ratio from above: cheap, and enough to sort out
        quick = difflib.SequenceMatcher(None, first, line, autojunk=False).quick_ratio()
        if max(by_tokens, quick) >= 0.5:
            scored.append(((by_tokens + quick) / 2, no, line, by_tokens))
    scored.sort(key=lambda t: (-t[0], t[1]))
    best = []
    for _, no, line, by_tokens in scored[: limit * 8]:
        chars = difflib.SequenceMatcher(None, first, line, autojunk=False).ratio()
        best.append(((by_tokens + chars) / 2, no, line))
    best.sort(key=lambda t: (-t[0], t[1]))
    return [f"{no}: {line}" for _, no, line in best[:limit]]


def nearest_region(text: str, anchor: str, lo: int = 0, hi: int | None = None) -> list[str]:
    """For an anchor of several lines missing from text[lo:hi]: the first anchor line that
    differs in the region there holding most of its lines in order, and that region, as
    "LINE: text" ([] for one line, or when no anchor line stands there)."""
    raw = anchor.strip("\n").splitlines()
    want = [ln.strip() for ln in raw]
    if len(want) < 2:
        return []
    first = line_of(text, lo) - 1
    lines = text[lo:hi].splitlines()
    have = [ln.strip() for ln in lines]
    at: dict[str, list[int]] = {}
    for i, line in enumerate(have):
        at.setdefault(line, []).append(i)
    starts = sorted({i - k for k, w in enumerate(want) if w for i in at.get(w, ())})
    if not starts:
        return []

    def same(s: int, k: int, exact: bool = False) -> bool:
        got = (lines if exact else have)[s + k] if 0 <= s + k < len(have) else None
        return got == (raw if exact else want)[k]
    best = max(starts, key=lambda s: sum(same(s, k) for k in range(len(want))))
    k = next((k for k in range(len(want)) if not same(best, k)), None)
    if k is None:       # every line stands there: its blanks differ
        k = next((k for k in range(len(want)) if not same(best, k, exact=True)), 0)
    got = have[best + k] if 0 <= best + k < len(have) else "(end of file)"
    a, b = max(best, 0), min(best + len(want), len(have))
    blanks = " (only its blanks differ)" if got == want[k] else ""
    return [f"anchor line {k + 1} of {len(want)} diverged: {want[k]!r}, upstream line {first + best + k + 1}: "
            f"{got!r}{blanks}; the region for the whole anchor: lines {first + a + 1}-{first + b}"] + \
        [f"{first + i + 1}: {have[i]}" for i in range(a, b)]


def _within(change: Change, text: str) -> tuple[int, int, tuple | None]:
    """(lo, hi, failed): the part of `text` the change's anchor is searched in, and the scope
    pattern that failed as (what, pattern, hits), else None. On a failure the part is the whole
    text (`within` not unique) or runs to the end (`within_end` not found)."""
    if change.within is None:
        return 0, len(text), None
    scopes = find_all(change.within, text, change.regex)
    if len(scopes) != 1:
        return 0, len(text), ("within", change.within, scopes)
    lo = scopes[0][1]
    if change.within_end is None:
        return lo, len(text), None
    ends = find_all(change.within_end, text, change.regex, lo)
    return (lo, ends[0][0], None) if ends else (lo, len(text), ("within_end", change.within_end, ends))


def scope(change: Change, text: str) -> tuple[int, int]:
    """The part of `text` the change's anchor is searched in (_within, leniently)."""
    return _within(change, text)[:2]


@dataclass(frozen=True)
class Located:
    start: int
    end: int


@dataclass(frozen=True)
class Miss:
    """Why a change's anchor was not located exactly once."""
    what: str                    # "within" | "within_end" | "anchor"
    pattern: str                 # the pattern that failed
    count: int                   # how often it matched where it was searched
    candidates: list[str] = field(default_factory=list)   # "LINE: text" of near or all hits

    @property
    def status(self) -> str:     # e.g. "anchor-missing", "within-ambiguous"
        return f"{self.what}-{'missing' if self.count == 0 else 'ambiguous'}"

    def error(self, change: Change, text: str, base_label: str) -> AnchorError:
        where = f"{change.file} at base {base_label}"
        if self.count == 0:
            return AnchorError(
                f"{change.origin}: {self.what} not found in {where}: "
                f"{_short(self.pattern)!r}{candidates_text(self.candidates, 'nearest')}",
                "upstream moved: update the anchor in the commit.toml (or run `llamacpp-mla-port "
                "rebase`); nothing was written")
        lines = [line_of(text, s) for s, _ in find_all(self.pattern, text, change.regex)]
        return AnchorError(
            f"{change.origin}: {self.what} matches {self.count} times in {where} (lines "
            f"{', '.join(map(str, lines[:10]))}): {_short(self.pattern)!r}",
            "make the anchor unique: add context lines, or narrow it with `within`/`within_end`; "
            "nothing was written")


def candidates_text(cand: list[str], word: str) -> str:
    """The candidates of a miss for a message: a multi-line anchor's diverged line and region
    (nearest_region), else the nearest lines."""
    if cand and cand[0].startswith("anchor line "):
        return f"; {cand[0]}: " + " | ".join(cand[1:])
    return f"; {word} candidate lines: " + " | ".join(cand) if cand else "; no similar lines"


def _short(s: str) -> str:
    s = s.strip("\n")
    lines = s.splitlines()
    return lines[0] + (f" ... (+{len(lines) - 1} lines)" if len(lines) > 1 else "")


def _miss(what: str, pattern: str, text: str, hits: list[tuple[int, int]], lo: int = 0,
          hi: int | None = None) -> Miss:
    if not hits:
        return Miss(what, pattern, 0, nearest_region(text, pattern, lo, hi) or nearest_lines(text, pattern))
    lines = text.splitlines()
    return Miss(what, pattern, len(hits),
                [f"{line_of(text, s)}: {lines[line_of(text, s) - 1].strip()}" for s, _ in hits[:5]])


def locate(change: Change, text: str) -> Located | Miss:
    """Where the change's anchor is in `text`, or why it is not there exactly once."""
    lo, hi, unscoped = _within(change, text)
    if unscoped is not None:
        what, pattern, hits = unscoped
        return _miss(what, pattern, text, hits)
    hits = find_all(change.anchor, text, change.regex, lo, hi)
    if len(hits) != 1:
        return _miss("anchor", change.anchor, text, hits, lo, hi)
    return Located(*hits[0])

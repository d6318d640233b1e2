"""A change upstream probably made in its own words: the lines a change adds that were not near
its anchor at the old base and stand near it at the new one (rebase.analyse asks, per change).

An exact merge (the inserted text verbatim at the anchor) is rebase's `merged-upstream`; this is
the looser look for a merge written differently: upstream's comment, its spacing, a line or two
of its own around ours. Lines compare by their tokens (series/anchors.tokens: blanks between
tokens aside), after their comments are cut. A line that says little on its own (a lone brace,
`return false;`, `break;`, `#endif`: fewer than two names that are not keywords) is left out,
as is any line that already stood near the anchor at the old base. "Near" is NEAR_LINES lines
around the anchor plus as many as the change adds (upstream may put its version of a block
just above or below ours).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

from llamacpp_mla_port.series.anchors import line_of, tokens

#: lines around the anchor (beyond the lines the change adds) that count as near it
NEAR_LINES = 6
#: files whose comments start with `#` (C and C++ use `#` for the preprocessor, not comments)
_HASH_COMMENTS = {".py", ".pyi", ".sh", ".cmake", ".txt", ".toml", ".yml", ".yaml", ".cfg", ".ini"}
_HASH_NAMES = {"CMakeLists.txt", "Makefile"}
_PROSE = {".md", ".rst"}
#: names that say nothing about what a line does, on their own
KEYWORDS = frozenset("""
    auto bool break case catch char class const constexpr continue default delete do double else
    endif enum explicit extern false float for if ifdef ifndef include inline int int32_t int64_t
    long namespace new nullptr NULL override private protected public return self short signed
    size_t sizeof static std struct switch template this throw true try typedef typename uint32_t
    uint64_t union unsigned using virtual void volatile while
    and as assert async await def del elif except finally from global import in is lambda None
    nonlocal not or pass raise True False with yield
""".split())


@dataclass(frozen=True)
class Hit:
    """One added line of a change that stands near its anchor upstream."""
    line: int        # its line in the file at the new base (as the change's commit sees it)
    text: str        # the line as upstream wrote it
    ours: str        # the line as the change adds it

    def to_json(self) -> dict:
        return asdict(self)


def _comment_style(path: str) -> str:
    p = PurePosixPath(path)
    if p.name in _HASH_NAMES or p.suffix in _HASH_COMMENTS:
        return "#"
    return "" if p.suffix in _PROSE else "//"


def key(line: str, path: str) -> str | None:
    """The line as compared: its tokens joined by one blank, comments cut; None when nothing of
    it tells a change apart (a comment, a brace, a keyword or two)."""
    toks = tokens(line)
    style = _comment_style(path)
    if style == "//":
        if toks and toks[0] in ("/", "*") and (len(toks) == 1 or toks[1] in ("*", "/")):
            return None                                   # a /* ... */ block's lines
        toks = toks[:toks.index("//")] if "//" in toks else toks
        if toks[:1] == ["*"]:
            return None
    elif style == "#":
        toks = toks[:toks.index("#")] if "#" in toks else toks
    names = {t for t in toks if (t[0].isalpha() or t[0] == "_") and t not in KEYWORDS}
    if len(names) < 2:
        return None
    return " ".join(toks)


def keys(lines: list[str], path: str) -> set[str]:
    return {k for k in (key(ln, path) for ln in lines) if k is not None}


def window(text: str, start: int, end: int, extra: int) -> tuple[int, list[str]]:
    """The lines near the anchor text[start:end]: (first line number, the lines)."""
    lines = text.splitlines()
    first = line_of(text, start) - 1
    last = line_of(text, max(start, end - 1))
    lo = max(0, first - NEAR_LINES - extra)
    return lo + 1, lines[lo:last + NEAR_LINES + extra]


def added_lines(rendered: str, replaced: str) -> list[str]:
    """The lines a change adds: what it inserts, less the lines of what it replaces (`replaced`
    is empty for an insertion)."""
    gone = Counter(ln.strip() for ln in replaced.splitlines())
    out = []
    for ln in rendered.splitlines():
        if gone[ln.strip()]:
            gone[ln.strip()] -= 1
        else:
            out.append(ln)
    return out


def near_keys(path: str, text: str, start: int, end: int, extra: int) -> frozenset[str]:
    """What stands near an anchor (at the old base: the lines that were always there)."""
    return frozenset(keys(window(text, start, end, extra)[1], path))


def upstream_hits(path: str, added: list[str], text: str, start: int, end: int,
                  before: frozenset[str]) -> list[Hit]:
    """The change's added lines that stand near its anchor text[start:end] at the new base and
    did not at the old base (`before`: near_keys there); each once, in the change's order."""
    mine = [(k, ln) for ln in added if (k := key(ln, path)) is not None and k not in before]
    if not mine:
        return []
    first, near = window(text, start, end, len(added))
    where: dict[str, tuple[int, str]] = {}
    for i, ln in enumerate(near):
        k = key(ln, path)
        if k is not None:
            where.setdefault(k, (first + i, ln.strip()))
    hits, seen = [], set()
    for k, ours in mine:
        if k in where and k not in seen:
            seen.add(k)
            hits.append(Hit(line=where[k][0], text=where[k][1], ours=ours.strip()))
    return hits

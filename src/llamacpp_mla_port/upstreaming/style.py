"""Upstream's style rules for what the series adds (AGENTS.md, CONTRIBUTING.md).

- a subject is `<module> : <title>`, at most 72 characters, with ONE module prefix;
- a body is short (at most BODY_LINES lines);
- every comment the series adds to C/C++ or Python is at most 2 lines, and never split
  mid-sentence: in a block of consecutive comment lines every line but the last ends a
  sentence (`.`, `!` or `?`, optionally before a closing parenthesis), never a colon or semicolon;
- every added line is ASCII (no em dashes, arrows, multiplication signs).
`findings(patch_text)` checks one format-patch file; tests/series/test_stacks.py keeps patches/
and every PR stack clean, and `make pr` reports the same per commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import unidiff

from llamacpp_mla_port.series.spec import TITLE

SUBJECT_MAX = 72
BODY_LINES = 12
COMMENT_LINES = 2
#: a second prefix inside the title: "model : dflash: ..." or "docs : x : ..."
_SECOND_PREFIX = re.compile(r"^[A-Za-z0-9_.+/-]+ ?: ")
_C_EXT = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".m", ".metal")
_PY_EXT = (".py",)
#: the end of a sentence, optionally before a closing parenthesis
_CLAUSE_END = re.compile(r"[.!?]\)?$")


@dataclass(frozen=True)
class StyleFinding:
    where: str          # "subject", "body" or "path:line"
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}: {self.message}"


def subject_findings(subject: str) -> list[StyleFinding]:
    out = []
    if len(subject) > SUBJECT_MAX:
        out.append(StyleFinding("subject", "length", f"{len(subject)} characters (at most {SUBJECT_MAX}): {subject}"))
    m = TITLE.match(subject)
    if not m:
        out.append(StyleFinding("subject", "prefix", f"not `<module> : <title>` (upstream's form): {subject}"))
    elif _SECOND_PREFIX.match(m["title"]):
        out.append(StyleFinding("subject", "prefix", f"two module prefixes (keep one): {subject}"))
    if not subject.isascii():
        out.append(StyleFinding("subject", "ascii", f"non-ASCII character: {subject}"))
    return out


def message_findings(message: str) -> list[StyleFinding]:
    """Subject and body of a commit message (title line, blank line, body)."""
    subject, _, rest = message.partition("\n")
    out = subject_findings(subject.strip())
    body = rest.strip("\n").splitlines()
    if rest.strip() and not rest.startswith("\n"):
        out.append(StyleFinding("body", "blank", "no blank line after the subject"))
    if len(body) > BODY_LINES:
        out.append(StyleFinding("body", "length", f"{len(body)} lines (at most {BODY_LINES}: "
                                "say what and why; the evidence goes in the PR folder)"))
    if not rest.isascii():
        out.append(StyleFinding("body", "ascii", "non-ASCII character in the body"))
    return out


def _comment(path: str, text: str) -> bool:
    s = text.strip()
    if path.endswith(_C_EXT):
        if s.startswith("/*") and "*/" in s:     # `/* .name = */ value,`: code after it
            return not s[s.index("*/") + 2:].strip()
        # a block comment's inner lines start with "* " (a line like `*out = x;` is code)
        return s.startswith(("//", "/*", "* ")) or s == "*" or (s.endswith("*/") and "/*" not in s)
    if path.endswith(_PY_EXT):
        return s.startswith("#")
    return False


def _comment_words(path: str, text: str) -> str:
    """The words of a comment line, without its markers (`//`, `#`, `/*`, `*/`, a leading `*`)."""
    s = text.strip()
    if path.endswith(_PY_EXT):
        return s.lstrip("#").strip()
    return s.removeprefix("//").removeprefix("/*").removesuffix("*/").strip().removeprefix("*").strip()


def split_findings(path: str, block: list[tuple[int, str]]) -> list[StyleFinding]:
    """A comment block split mid-sentence: a line before the last that does not end a sentence,
    a colon or semicolon included (AGENTS.md: comments are never hard-wrapped mid-sentence)."""
    out = []
    for line_no, text in block[:-1]:
        words = _comment_words(path, text)
        if words and not _CLAUSE_END.search(words):
            out.append(StyleFinding(f"{path}:{line_no}", "split",
                                    f"comment split mid-sentence (end the line with . ! or ?, "
                                    f"or make it one line): {text.strip()}"))
    return out


def added_line_findings(patch_text: str) -> list[StyleFinding]:
    """Comment blocks longer than COMMENT_LINES or split mid-sentence, and non-ASCII text,
    among added lines."""
    out = []
    for f in unidiff.PatchSet(patch_text):
        for hunk in f:
            run: list[tuple[int, str]] = []

            def close() -> None:
                if len(run) > COMMENT_LINES:
                    out.append(StyleFinding(f"{f.path}:{run[0][0]}", "comment",
                                            f"{len(run)}-line comment (at most {COMMENT_LINES})"))
                out.extend(split_findings(f.path, run))
                run.clear()

            for line in hunk:
                if line.is_added and _comment(f.path, line.value):
                    run.append((line.target_line_no, line.value))
                    continue
                close()
                if line.is_added and not line.value.isascii():
                    bad = next(ch for ch in line.value if not ch.isascii())
                    out.append(StyleFinding(f"{f.path}:{line.target_line_no}", "ascii",
                                            f"non-ASCII character {bad!r} (U+{ord(bad):04X})"))
            close()
    return out


def split_patch(patch_text: str) -> tuple[str, str] | None:
    """(subject, body) of a `git format-patch` file, the folded subject unfolded."""
    head, sep, _ = patch_text.partition("\n---\n")
    lines = head.split("\n")
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Subject: ")), None)
    if not sep or start is None:
        return None
    end = start + 1
    while end < len(lines) and lines[end].startswith(" "):     # folded subject lines
        end += 1
    subject = " ".join(ln.strip() for ln in lines[start:end])
    subject = re.sub(r"^Subject: (?:\[PATCH[^\]]*\] )?", "", subject)
    return subject, "\n".join(lines[end:]).strip("\n")


def patch_findings(patch_text: str) -> list[StyleFinding]:
    """Everything above for one `git format-patch` file."""
    parts = split_patch(patch_text)
    if parts is None:
        return [StyleFinding("patch", "format", "no Subject/body found")]
    subject, body = parts
    return message_findings(subject + "\n\n" + body + "\n") + added_line_findings(patch_text)

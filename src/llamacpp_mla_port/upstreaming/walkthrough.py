"""WALKTHROUGH.md of a PR folder: every hunk of every commit, for the human who will own it.

Upstream's AGENTS.md asks that a contributor can explain every line of a PR. This file is the
owner's reading list, not text to post: per hunk, where it sits (file, lines, the function git
names in the hunk header), what the hunk's own comments say, which test hunks of the same PR
name what it adds, and what the PR's evidence says fails without it. What the tool cannot know
(which upstream code a hunk follows, why this way) is left as a question for the owner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.header import decode_header, make_header
from pathlib import Path

import unidiff

from llamacpp_mla_port.process import git
from llamacpp_mla_port.series.spec import Stack

FILE = "WALKTHROUGH.md"
#: what a hunk adds that a test can name: identifiers, and message text in string literals
_NAME = re.compile(r"\b(?=\w*(?:_|[a-z][A-Z]))[A-Za-z_]\w{5,}\b")   # snake_case, camelCase, MACROS
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
#: an evidence claim that shows the change is needed (the test fails without it)
_FAILS_WITHOUT = re.compile(r"fails? (on the pin )?without|on the base .* (fails|dies|refused)")
_COMMENT = {".py": ("#",), ".sh": ("#",), ".cmake": ("#",), ".txt": ("#",)}


@dataclass
class Hunk:
    path: str
    start: int
    length: int
    context: str            # the function line git puts in the hunk header
    added: int
    removed: int
    comments: list[str]     # the comment lines the hunk adds
    names: set[str]         # identifiers and message text it adds that the base file lacks
    text: str               # the added lines, for matching tests against other hunks


@dataclass
class Commit:
    subject: str
    body: str
    hunks: list[Hunk] = field(default_factory=list)


def _is_test(path: str) -> bool:
    return path.startswith("tests/") or "/tests/" in path


def _header(text: str, name: str) -> str:
    m = re.search(rf"^{name}: (.*(?:\n[ \t].*)*)", text, re.M)
    return str(make_header(decode_header(m.group(1).replace("\n", "")))) if m else ""


def parse_patch(text: str, base_text=lambda path: "") -> Commit:
    """One `git format-patch` file: its subject, message body and hunks. `base_text(path)`:
    the file on the base, so that only what the hunk brings new is followed to the tests."""
    head, _, rest = text.partition("\n\n")
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", _header(head, "Subject"))
    body = ("\n" + rest).split("\n---\n", 1)[0].strip()     # no body: "---" comes first
    commit = Commit(subject=subject, body=body)
    for pf in unidiff.PatchSet(text):
        marks = _COMMENT.get(Path(pf.path).suffix, ("//", "/*", "*"))
        known = set(_NAME.findall(base_text(pf.path) or ""))
        for h in pf:
            plus = [ln.value.rstrip("\n") for ln in h if ln.is_added]
            other = " ".join(ln.value for ln in h if not ln.is_added)
            comments = [s.strip() for s in plus if s.strip().startswith(marks)]
            code = [s for s in plus if not s.strip().startswith(marks)]
            names = ({n for s in code for n in _NAME.findall(_STRING.sub('""', s))}
                     - set(_NAME.findall(other)) - known) | \
                {m[1:25] for s in code for m in _STRING.findall(s)
                 if len(m) >= 14 and m[1:25] not in other}
            commit.hunks.append(Hunk(path=pf.path, start=h.target_start, length=h.target_length,
                                     context=h.section_header.strip(), added=h.added,
                                     removed=h.removed, comments=comments, names=names,
                                     text="\n".join(plus)))
    return commit


def _tests_naming(hunk: Hunk, commits: list[Commit]) -> list[str]:
    """Test hunks of the PR whose added lines use a name this hunk adds."""
    out = []
    for c in commits:
        for t in c.hunks:
            if t is hunk or not _is_test(t.path):
                continue
            used = sorted(n for n in hunk.names if n in t.text and
                          (" " in n or re.search(rf"\b{re.escape(n)}\b", t.text)))
            if used:
                shown = ", ".join(f"`{n}`" for n in used[:4])
                out.append(f"`{t.path}` line {t.start} ({c.subject}): uses {shown}")
    return out


def render(stack: Stack, patch_files: list[Path], base_text=lambda path: "") -> str:
    commits = [parse_patch(p.read_text(encoding="utf-8"), base_text) for p in patch_files]
    needed = [e for e in stack.evidence if _FAILS_WITHOUT.search(e.claim)]
    n_hunks = sum(len(c.hunks) for c in commits)
    out = [f"# Walkthrough: {stack.title}", "",
           "For you, the owner of this PR: read it before you open the PR, and be able to "
           "explain every hunk without help (upstream's AGENTS.md). It is not text to post. "
           "Each `TODO(owner)` is a question only you can answer.", "",
           f"{len(commits)} commit(s), {n_hunks} hunk(s).", "",
           "## What proves it", ""]
    out += [f"- {e.claim}  \n  `{e.command}`" for e in stack.evidence] or ["- (no evidence listed)"]
    for i, c in enumerate(commits, 1):
        out += ["", f"## {i}. {c.subject}", ""]
        first = c.body.split("\n\n", 1)[0].replace("\n", " ").strip()
        out += [f"The message says: {first}" if first else "TODO(owner): the commit has no body.", ""]
        for h in c.hunks:
            where = f"`{h.path}` lines {h.start}-{h.start + max(h.length, 1) - 1}"
            out += [f"### {where}" + (f", in `{h.context}`" if h.context else ""), "", f"+{h.added}/-{h.removed}."]
            if h.comments:
                out.append("Its comments say: " + " ".join(h.comments[:3]))
            if _is_test(h.path):
                out.append("This hunk is a test: run it on the base to see what it catches.")
            else:
                tests = _tests_naming(h, commits)
                out += (["Tests in this PR that use what it adds:", *[f"- {t}" for t in tests]]
                        if tests else ["No test hunk of this PR names what it adds: "
                                       "TODO(owner): which test covers it?"])
                out += ([f"The PR's evidence of need: {e.claim}" for e in needed]
                        or ["TODO(owner): what fails without this hunk?"])
                out.append("TODO(owner): which upstream code does it follow, and why this way?")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def write(folder: Path, stack: Stack, repo, base: str) -> Path:
    """WALKTHROUGH.md of the PR folder, from its patches/ and the base they apply to."""
    def base_text(path: str) -> str:
        return (git.read_blob(repo, base, path) or b"").decode("utf-8", "replace")
    path = folder / FILE
    path.write_text(render(stack, sorted((folder / "patches").glob("*.patch")), base_text), encoding="utf-8")
    return path

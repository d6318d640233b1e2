"""Render the series in memory: templates + anchors -> full new file contents per commit.

Nothing is written here. Each commit is applied to the file contents left by the commits
before it, so a later commit can anchor on text an earlier one inserted. Every anchor must
match exactly once; all anchors of one file are located before any text is changed.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Callable

import jinja2

from llamacpp_mla_port.errors import AnchorError, RenderError
from llamacpp_mla_port.series.spec import Change, Series


@dataclass(frozen=True)
class RenderedCommit:
    slug: str
    message: str                  # title line, blank line, body; ends with a newline
    files: dict[str, bytes]       # path -> full content after this commit


def make_env(series: Series) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(series.root)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _render(env: jinja2.Environment, template: str, context: dict, origin: str) -> str:
    try:
        return env.get_template(template).render(**context)
    except jinja2.UndefinedError as err:
        raise RenderError(f"{origin}: template {template}: {err.message}",
                          "define the variable in templates/port.toml [vars] or the commit's "
                          "commit.toml [vars]") from None
    except jinja2.TemplateSyntaxError as err:
        raise RenderError(f"{origin}: template {err.filename or template} line {err.lineno}: "
                          f"{err.message}",
                          "C++ with `{{`, `{%` or `{#` must sit inside {% raw %}...{% endraw %}") from None


def find_all(pattern: str, text: str, regex: bool, start: int = 0, end: int | None = None):
    end = len(text) if end is None else end
    if regex:
        return [(m.start(), m.end()) for m in re.compile(pattern, re.M).finditer(text, start, end)]
    out, i = [], text.find(pattern, start, end)
    while i != -1 and i + len(pattern) <= end:
        out.append((i, i + len(pattern)))
        i = text.find(pattern, i + 1, end)
    return out


def nearest_lines(text: str, anchor: str, limit: int = 3) -> list[str]:
    """The lines of `text` most similar to the anchor's first non-blank line."""
    first = next((ln.strip() for ln in anchor.splitlines() if ln.strip()), anchor.strip())
    lines = text.splitlines()
    scored = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        ratio = difflib.SequenceMatcher(None, first, line.strip(), autojunk=False).quick_ratio()
        if ratio >= 0.5:
            scored.append((ratio, no, line))
    scored.sort(key=lambda t: (-t[0], t[1]))
    best = []
    for ratio, no, line in scored[: limit * 8]:
        real = difflib.SequenceMatcher(None, first, line.strip(), autojunk=False).ratio()
        best.append((real, no, line))
    best.sort(key=lambda t: (-t[0], t[1]))
    return [f"{no}: {line.strip()}" for _, no, line in best[:limit]]


def _short(s: str) -> str:
    s = s.strip("\n")
    lines = s.splitlines()
    return lines[0] + (f" ... (+{len(lines) - 1} lines)" if len(lines) > 1 else "")


def locate(change: Change, text: str, base_label: str) -> tuple[int, int]:
    """(start, end) of the change's anchor in `text`; raises AnchorError unless unique."""
    lo, hi = 0, len(text)
    where = f"{change.file} at base {base_label}"
    if change.within is not None:
        scopes = find_all(change.within, text, change.regex)
        if len(scopes) != 1:
            raise _anchor_error(change, text, change.within, len(scopes), where, "within")
        lo = scopes[0][1]
        if change.within_end is not None:
            ends = find_all(change.within_end, text, change.regex, lo)
            if not ends:
                raise _anchor_error(change, text, change.within_end, 0, where, "within_end")
            hi = ends[0][0]
    hits = find_all(change.anchor, text, change.regex, lo, hi)
    if len(hits) != 1:
        raise _anchor_error(change, text, change.anchor, len(hits), where, "anchor")
    return hits[0]


def _anchor_error(change: Change, text: str, pattern: str, count: int, where: str,
                  what: str) -> AnchorError:
    if count == 0:
        near = nearest_lines(text, pattern)
        cand = ("; nearest candidate lines: " + " | ".join(near)) if near else "; no similar lines"
        return AnchorError(
            f"{change.origin}: {what} not found in {where}: {_short(pattern)!r}{cand}",
            "upstream moved: update the anchor in the commit.toml (or run `llamacpp-mla-port "
            "rebase`); nothing was written")
    lines = [text.count("\n", 0, s) + 1 for s, _ in find_all(pattern, text, change.regex)]
    return AnchorError(
        f"{change.origin}: {what} matches {count} times in {where} (lines "
        f"{', '.join(map(str, lines[:10]))}): {_short(pattern)!r}",
        "make the anchor unique: add context lines, or narrow it with `within`/`within_end`; "
        "nothing was written")


class Overlay:
    """File contents as the series goes: the base, overlaid with what earlier commits wrote."""

    def __init__(self, read_base: Callable[[str], bytes | None]):
        self._read_base = read_base
        self._files: dict[str, bytes | None] = {}

    def read(self, path: str) -> bytes | None:
        if path not in self._files:
            self._files[path] = self._read_base(path)
        return self._files[path]

    def write(self, path: str, data: bytes) -> None:
        self._files[path] = data


def render_series(series: Series, read_base: Callable[[str], bytes | None],
                  base_label: str, extra_vars: dict | None = None) -> list[RenderedCommit]:
    """Render all commits; `read_base(path)` gives a file's content at the base or None."""
    env = make_env(series)
    overlay = Overlay(read_base)
    read = overlay.read

    out = []
    for commit in series.commits:
        context = {**series.vars, **commit.vars, **(extra_vars or {})}
        by_file: dict[str, list[Change]] = {}
        for change in commit.changes:
            by_file.setdefault(change.file, []).append(change)
        files: dict[str, bytes] = {}
        for path, changes in by_file.items():
            before = read(path)
            if any(c.placement == "create" for c in changes):
                if len(changes) != 1:
                    raise RenderError(f"{changes[0].origin}: {path} is created and also edited "
                                      "in the same commit", "put the whole file in one template")
                if before is not None:
                    raise AnchorError(f"{changes[0].origin}: cannot create {path}: it already "
                                      f"exists at base {base_label}",
                                      "edit it with an anchor instead, or it was merged "
                                      "upstream; nothing was written")
                text = _render(env, changes[0].template, {**context, **changes[0].vars},
                               changes[0].origin)
                files[path] = text.encode("utf-8")
                continue
            if before is None:
                raise AnchorError(f"{changes[0].origin}: {path} does not exist at base "
                                  f"{base_label}", "upstream moved or renamed the file; update "
                                  "`file` in the commit.toml; nothing was written")
            try:
                text = before.decode("utf-8")
            except UnicodeDecodeError:
                raise RenderError(f"{changes[0].origin}: {path} is not UTF-8 text",
                                  "the engine edits text files only") from None
            spans = []
            for change in changes:
                start, end = locate(change, text, base_label)
                rendered = _render(env, change.template, {**context, **change.vars},
                                   change.origin)
                if change.placement == "after":
                    spans.append((end, end, rendered, change))
                elif change.placement == "before":
                    spans.append((start, start, rendered, change))
                else:
                    spans.append((start, end, rendered, change))
            spans.sort(key=lambda s: (s[0], s[1]))
            for (s1, e1, _, c1), (s2, e2, _, c2) in zip(spans, spans[1:]):
                if s2 < e1:
                    raise RenderError(f"{c1.origin} and {c2.origin} overlap in {path}",
                                      "merge them into one change")
            for s, e, rendered, _ in reversed(spans):
                text = text[:s] + rendered + text[e:]
            files[path] = text.encode("utf-8")
        if all(files[p] == read(p) for p in files):
            raise RenderError(f"series/{commit.slug}: the commit changes nothing at base "
                              f"{base_label}", "its change is already there (merged upstream?): "
                              "drop the commit folder or fix its templates")
        for path, data in files.items():
            overlay.write(path, data)
        message = _render(env, commit.message_template, context, f"series/{commit.slug}")
        message = message.strip("\n") + "\n"
        title = message.splitlines()[0]
        if not re.match(r"^[a-z0-9_./-]+( [a-z0-9_./-]+)* : \S", title):
            raise RenderError(f"series/{commit.slug}: commit title {title!r} is not in llama.cpp "
                              "style `<module> : <title>`", "edit message.txt.j2's first line")
        if len(message.splitlines()) > 1 and message.splitlines()[1].strip():
            raise RenderError(f"series/{commit.slug}: the commit title must be followed by a "
                              "blank line", "edit message.txt.j2")
        out.append(RenderedCommit(slug=commit.slug, message=message, files=files))
    return out


def render_change_text(env: jinja2.Environment, change: Change, context: dict) -> str:
    """The text one change inserts (for tools that inspect changes one by one, e.g. rebase)."""
    return _render(env, change.template, {**context, **change.vars}, change.origin)

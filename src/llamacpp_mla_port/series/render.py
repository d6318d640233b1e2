"""Render the series in memory: templates + anchors -> full new file contents per commit.

Nothing is written here. Each commit is applied to the file contents left by the commits
before it, so a later commit can anchor on text an earlier one inserted. One walk serves both
`make patch` (strict: the first miss raises) and rebase's report (lenient: every change is
recorded and the walk goes on), so the two cannot disagree. Anchors: series/anchors.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jinja2

from llamacpp_mla_port.errors import AnchorError, PortError, RenderError
from llamacpp_mla_port.series import anchors
from llamacpp_mla_port.series.anchors import Located, Miss
from llamacpp_mla_port.series.spec import TITLE, Change, Commit, Series


@dataclass(frozen=True)
class RenderedCommit:
    slug: str
    message: str                  # title line, blank line, body; ends with a newline
    files: dict[str, bytes]       # path -> full content after this commit


def make_env(series: Series) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(series.root)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def _render(env: jinja2.Environment, template: str, context: dict, origin: str) -> str:
    try:
        return env.get_template(template).render(**context)
    except jinja2.UndefinedError as err:
        raise RenderError(f"{origin}: template {template}: {err.message}",
                          "define the variable in templates/port.toml [vars] or the commit's "
                          "commit.toml [vars]") from None
    except jinja2.TemplateSyntaxError as err:
        raise RenderError(f"{origin}: template {err.filename or template} line {err.lineno}: {err.message}",
                          "C++ with `{{`, `{%` or `{#` must sit inside {% raw %}...{% endraw %}") from None


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


@dataclass
class Step:
    """One change met by the walk, before it is applied (what a lenient walk's `decide` sees)."""
    commit_index: int
    commit: Commit
    title: str                    # lenient walk: the commit's title (its slug if it fails)
    change: Change
    path: str
    before: bytes | None          # the file before this commit (None: it does not exist)
    text: str | None              # `before` decoded (None: missing or not UTF-8)
    rendered: str | None          # the text the change inserts (None: rendering failed)
    error: PortError | None       # why rendering failed
    where: Located | Miss | None  # the anchor (None: a create, or no text to search)


#: lenient walk: record the step and say whether to apply it (it is applied only if it can be)
Decide = Callable[[Step], bool]


def render_series(series: Series, read_base: Callable[[str], bytes | None],
                  base_label: str, extra_vars: dict | None = None) -> list[RenderedCommit]:
    """Render all commits; `read_base(path)` gives a file's content at the base or None.
    Strict: the first anchor that is not unique, or any other problem, raises."""
    return walk_series(series, read_base, base_label, extra_vars)


def _title(env: jinja2.Environment, commit: Commit, context: dict) -> str:
    try:
        return _render(env, commit.message_template, context, f"series/{commit.slug}").strip().splitlines()[0]
    except (PortError, jinja2.TemplateError, IndexError):
        return commit.slug


def walk_series(series: Series, read_base: Callable[[str], bytes | None], base_label: str,
                extra_vars: dict | None = None,
                decide: Decide | None = None) -> list[RenderedCommit]:
    """The one walk of the series over a tree, commit by commit; a later commit sees the text
    earlier ones inserted.

    Strict (`decide` None): raise on the first miss; the result is the series' output.
    Lenient: every change goes to `decide` (which records it) and the walk goes on; a change
    is applied when `decide` says so and it rendered and was located (or creates a new file).
    Commit-level checks (empty commit, title style, overlaps) are strict only."""
    strict = decide is None
    env = make_env(series)
    overlay = Overlay(read_base)
    read = overlay.read
    out = []
    present = set(series.slugs())
    for ci, commit in enumerate(series.commits):
        # series_commits: the commits of this rendering (a stack alone, or the series), as
        # with_commit / without_commit see them
        context = {**series.vars, **commit.vars, **(extra_vars or {}), "series_commits": sorted(present)}
        title = "" if strict else _title(env, commit, context)
        by_file: dict[str, list[Change]] = {}
        for change in commit.changes:
            if change.wanted(present):
                by_file.setdefault(change.file, []).append(change)
        files: dict[str, bytes] = {}
        for path, changes in by_file.items():
            before = read(path)
            creates = any(c.placement == "create" for c in changes)
            if strict and creates:
                if len(changes) != 1:
                    raise RenderError(f"{changes[0].origin}: {path} is created and also edited "
                                      "in the same commit", "put the whole file in one template")
                if before is not None:
                    raise AnchorError(f"{changes[0].origin}: cannot create {path}: it already "
                                      f"exists at base {base_label}",
                                      "edit it with an anchor instead, or it was merged "
                                      "upstream; nothing was written")
            if strict and not creates and before is None:
                raise AnchorError(f"{changes[0].origin}: {path} does not exist at base "
                                  f"{base_label}", "upstream moved or renamed the file; update "
                                  "`file` in the commit.toml; nothing was written")
            text = None
            if before is not None:
                try:
                    text = before.decode("utf-8")
                except UnicodeDecodeError:
                    if strict:
                        raise RenderError(f"{changes[0].origin}: {path} is not UTF-8 text",
                                          "the engine edits text files only") from None
            spans = []
            for change in changes:
                rendered, error = None, None
                try:
                    rendered = _render(env, change.template, {**context, **change.vars}, change.origin)
                except PortError as err:
                    error = err
                where = None
                if change.placement != "create" and text is not None:
                    where = anchors.locate(change, text)
                if strict:
                    if isinstance(where, Miss):
                        raise where.error(change, text, base_label)
                    if error is not None:
                        raise error
                else:
                    step = Step(ci, commit, title, change, path, before, text, rendered, error, where)
                    if not decide(step) or error is not None:
                        continue
                if change.placement == "create":
                    if before is None:
                        files[path] = rendered.encode("utf-8")
                    continue
                if not isinstance(where, Located):
                    continue
                start = where.end if change.placement == "after" else where.start
                end = where.start if change.placement == "before" else where.end
                spans.append((start, end, rendered, change))
            if text is None or not spans:
                continue
            spans.sort(key=lambda s: (s[0], s[1]))
            if strict:
                for (s1, e1, _, c1), (s2, e2, _, c2) in zip(spans, spans[1:]):
                    if s2 < e1:
                        raise RenderError(f"{c1.origin} and {c2.origin} overlap in {path}",
                                          "merge them into one change")
            for s, e, rendered, _ in reversed(spans):
                text = text[:s] + rendered + text[e:]
            files[path] = text.encode("utf-8")
        if strict and all(files[p] == read(p) for p in files):
            raise RenderError(f"series/{commit.slug}: the commit changes nothing at base "
                              f"{base_label}", "its change is already there (merged upstream?): "
                              "drop the commit folder or fix its templates")
        for path, data in files.items():
            overlay.write(path, data)
        if not strict:
            out.append(RenderedCommit(slug=commit.slug, message=title + "\n", files=files))
            continue
        message = _render(env, commit.message_template, context, f"series/{commit.slug}").strip("\n") + "\n"
        title = message.splitlines()[0]
        if not TITLE.match(title):
            raise RenderError(f"series/{commit.slug}: commit title {title!r} is not in llama.cpp "
                              "style `<module> : <title>`", "edit message.txt.j2's first line")
        if len(message.splitlines()) > 1 and message.splitlines()[1].strip():
            raise RenderError(f"series/{commit.slug}: the commit title must be followed by a "
                              "blank line", "edit message.txt.j2")
        out.append(RenderedCommit(slug=commit.slug, message=message, files=files))
    return out

"""The analysis of a rebase: every change of the series located at a base, commit by commit,
without stopping (the lenient walk of series/render.py), each with its status (rebase.py's module
doc lists them), so one run reports every failing, merged or probably merged change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llamacpp_mla_port.series import anchors
from llamacpp_mla_port.series.anchors import Miss
from llamacpp_mla_port.series.render import Step, walk_series
from llamacpp_mla_port.series.spec import Series
from llamacpp_mla_port.upstreaming import own_words

FAILED = ("anchor-missing", "anchor-ambiguous", "within-missing", "within-ambiguous",
          "within_end-missing", "file-missing", "file-exists", "render-error")
MERGED = "merged-upstream"
PROBABLE = "probably-merged"
#: an inserted text this large that already occurs verbatim in the file is a duplicate,
#: not a coincidence (a single `}` or blank line is not)
_SUBSTANTIAL_LINES = 2
_SUBSTANTIAL_CHARS = 40


# ------------------------------------------------------------------------------ reports
@dataclass
class ChangeReport:
    commit: str                  # series folder, e.g. "10-gguf-py-dflash-mla-tensors"
    title: str                   # commit title (patch subject)
    patch: str                   # patch number in the series, e.g. "0001"
    change: str                  # "series/NN-slug/commit.toml change #i"
    file: str
    placement: str
    status: str
    anchor: str | None = None    # the pattern that failed (or the anchor when ok)
    line: int | None = None      # line of the anchor (or of the merged text) at the new base
    old_line: int | None = None  # line of the anchor at the old base
    candidates: list[str] = field(default_factory=list)
    message: str = ""
    present: int | None = None   # how often its inserted text occurs in its scope there
    #: probably-merged: its added lines that stand near the anchor upstream (own_words.Hit)
    upstream_lines: list[dict] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status in FAILED


@dataclass(frozen=True)
class Seen:
    """A change as the analysis met it at the OLD base: how often its inserted text occurred
    in the file, and what stood near its anchor (own_words.near_keys; None: not located)."""
    present: int | None
    near: frozenset[str] | None


# ----------------------------------------------------------------------------- analysis
_line = anchors.line_of


def _substantial(s: str) -> bool:
    return len([ln for ln in s.splitlines() if ln.strip()]) >= _SUBSTANTIAL_LINES or \
        len("".join(s.split())) >= _SUBSTANTIAL_CHARS


def analyse(series: Series, read_base, base_label: str, extra_vars: dict,
            patch_names: list[str] | None = None,
            baseline: dict[str, Seen] | None = None,
            seen: dict[str, Seen] | None = None) -> list[ChangeReport]:
    """Locate every change of the series at a base, commit by commit, without stopping: the
    lenient walk of series/render.py (the one `make patch` runs strictly), skipping a failed
    or merged change, so one run reports them all. Only render_series produces output.

    `baseline` (change -> Seen at the OLD base) tells a merge upstream apart from text that was
    always there elsewhere (two arch lists may share lines): the text counts as merged when it
    occurs more often now than it did then; and an added line near the anchor now, not then,
    makes the change probably-merged. `seen`, when given, is filled with this base's Seen.
    """
    reports: list[ChangeReport] = []

    def decide(step: Step) -> bool:
        change, path, text = step.change, step.path, step.text
        patch = patch_names[step.commit_index] \
            if patch_names and len(patch_names) == len(series.commits) \
            else f"{step.commit_index + 1:04d}"

        def report(status: str, **kw) -> None:
            reports.append(ChangeReport(commit=step.commit.slug, title=step.title, patch=patch,
                                        change=change.origin, file=change.file,
                                        placement=change.placement, status=status, **kw))

        if step.error is not None:
            report("render-error", message=step.error.message)
            return False
        rendered = step.rendered
        if change.placement == "create":
            if step.before is None:
                report("ok", message="new file")
                return True
            if step.before == rendered.encode("utf-8"):
                report(MERGED, line=1, message="the file already exists upstream with exactly this content")
            else:
                report("file-exists", message=f"{path} already exists upstream with other content")
            return False
        if text is None:
            report("file-missing", anchor=change.anchor,
                   message=f"{path} does not exist (or is not UTF-8 text) upstream")
            return False
        lo, hi = anchors.scope(change, text)
        count = text.count(rendered) if rendered.strip() else 0
        in_scope = text.count(rendered, lo, hi) if rendered.strip() else 0
        before = (baseline or {}).get(change.origin)
        was = before.present if before is not None else None
        # with a baseline: more copies than at the old base (anywhere in the file: a
        # `within_end` may now cut the merged text); without: a big copy in scope
        grew = count > was if was is not None else (in_scope > 0 and _substantial(rendered))
        if not in_scope:
            lo, hi = 0, len(text)       # where a copy is looked up for the message
        where = step.where
        replaced = text[where.start:where.end] if isinstance(where, anchors.Located) and \
            change.placement == "replace" else ""
        added = own_words.added_lines(rendered, replaced)
        if seen is not None:
            seen[change.origin] = Seen(count, own_words.near_keys(
                path, text, where.start, where.end, len(added))
                if isinstance(where, anchors.Located) else None)
        if isinstance(where, Miss):
            if grew:
                at = _line(text, text.index(rendered, lo, hi))
                report(MERGED, anchor=change.anchor, line=at, present=count,
                       message=f"the anchor moved or went, but the inserted text is already in {path} at line {at}")
                return False
            report(where.status, anchor=where.pattern, candidates=where.candidates, present=count,
                   message=_failure_text(where.status, path, where.pattern, where.candidates, base_label))
            return False
        start, end = where.start, where.end
        line = _line(text, start)
        if (change.placement == "after" and text.startswith(rendered, end)) or \
                (change.placement == "before" and text.endswith(rendered, 0, start)) or \
                (change.placement == "replace" and rendered == text[start:end]):
            report(MERGED, anchor=change.anchor, line=line, present=count,
                   message=f"already present upstream at the anchor (line {line})")
            return False
        if was is not None and count > was:
            at = _line(text, text.index(rendered, lo, hi))
            report(MERGED, anchor=change.anchor, line=at, present=count,
                   message=f"the inserted text is already in {path} at line {at} (the anchor is at line {line})")
            return False
        hits = own_words.upstream_hits(path, added, text, start, end, before.near) \
            if before is not None and before.near is not None else []
        if hits:
            first = hits[0]
            more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
            report(PROBABLE, anchor=change.anchor, line=line, present=count,
                   upstream_lines=[h.to_json() for h in hits],
                   message=f"a line it adds already stands near the anchor (line {line}) "
                   f"upstream: line {first.line}: {first.text!r}{more}; merged in upstream's "
                   "own words? If so, drop the change; if not, keep it")
            return True
        report("ok", anchor=change.anchor, line=line, present=count)
        return True

    walk_series(series, read_base, base_label, extra_vars, decide=decide)
    return reports


def _failure_text(status: str, path: str, pattern: str, cand: list[str], label: str) -> str:
    what, _, kind = status.partition("-")
    first = next((ln.strip() for ln in pattern.splitlines() if ln.strip()), pattern.strip())
    verb = "matches several times" if kind == "ambiguous" else "not found"
    return f"{what} {verb} in {path} at {label}: {first!r}{anchors.candidates_text(cand, 'closest')}"

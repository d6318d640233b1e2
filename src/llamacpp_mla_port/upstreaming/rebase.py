"""`rebase --onto COMMIT|PATH`: re-render the series against a newer llama.cpp.

All-or-nothing. The new upstream goes into the cache repository, every change of every
commit is located again there (anchors are text, so moved lines are found again), and the
whole series is rendered in memory before anything is written. Only when every change
lands is the pin moved forward, patches/ re-exported and the tool's work tree (if there is
one) re-applied; on any problem the pin, patches/ and the work tree stay as they were.

Per change the report says one of:
- ok                  the anchor was found (with its line at the old and the new base);
- probably-merged     the anchor was found, but lines the change adds that were not near it
                      at the old base stand near it now (upstream's own words: own_words.py);
                      the change still renders, and the verdict says "review";
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
`make patch` gave, i.e. patches/ when they are up to date) with the series at the new base, and
the tree-identity check (identity.py) compares diff(old base, new base) with diff(old patched,
new patched), commit by commit: a region where they differ is one where the series' effect
changed. A probable merge or such a region makes the verdict "review": `--canary` is then not
ok; a rebase still moves the pin, and says what to review.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from llamacpp_mla_port.process import git
from llamacpp_mla_port.project import Places
from llamacpp_mla_port.errors import PinError, PortError, WorkTreeError
from llamacpp_mla_port.series import pipeline, gitseries as series_mod, stacks as stacks_mod
from llamacpp_mla_port.series.spec import Series, load_series
from llamacpp_mla_port.source import obtain
from llamacpp_mla_port.source.pin import Pin, load_pin
from llamacpp_mla_port.series.render import render_series
from llamacpp_mla_port.series.worktree import BASE_BRANCH, Workspace
from llamacpp_mla_port.source.obtain import Base
from llamacpp_mla_port.upstreaming import identity
# the analysis' names are the rebase report's (its readers import them from here)
from llamacpp_mla_port.upstreaming.analysis import (FAILED, MERGED, PROBABLE, ChangeReport,  # noqa: F401
                                                    _failure_text, analyse)
from llamacpp_mla_port.upstreaming.targets import Target, relation, resolve_target


# ------------------------------------------------------------------------------ the pin
def pin_text(old: Pin, new: Pin, old_text: str) -> str:
    """The new pin.toml: the header comment kept, [upstream] moved, [sdist] kept only when
    the new base is byte-for-byte the tree the sdist vendors."""
    header = list(itertools.takewhile(lambda ln: not ln.startswith("["), old_text.splitlines()))
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
        out += [f'package = "{sd.package}"', f'version = "{sd.version}"', f'filename = "{sd.filename}"',
                f'sha256 = "{sd.sha256}"', f"size = {sd.size}", f'subdir = "{sd.subdir}"', f'tree = "{sd.tree}"']
        if sd.packager_files:
            out += ["# The files the packager's own patches change (blob ids in `tree`): a git fetch of the",
                    "# tag may differ from `tree` there and nowhere else; the series touches none of them.",
                    "packager_files = { " + ", ".join(f'"{p}" = "{b}"' for p, b in sd.packager_files) + " }"]
        out.append("")
    elif old.sdist is not None:
        o = old.sdist
        out += [f"# No [sdist]: `llamacpp-mla-port rebase` moved the pin from {old.tag} "
                f"({(old.commit or old.tree)[:12]}).",
                f"# The PyPI sdist {o.package} {o.version} vendors that commit, not this one, so the",
                "# offline fallback of `--source auto` is off until the [sdist] table (package, version,",
                "# filename, sha256, size, subdir, tree) of a release vendoring this commit is added.", ""]
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
    #: rebased | up-to-date | canary-ok | canary-review | conflict | merged-upstream | stack-conflict
    status: str
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
    #: the tree-identity check (identity.check; not run when the series does not render)
    tree_identity: identity.Identity = field(
        default_factory=lambda: identity.not_run("the series does not render at the new base"))

    @property
    def first_failure(self) -> ChangeReport | None:
        bad = [c for c in self.changes if c.failed or c.status == MERGED]
        return bad[0] if bad else None

    @property
    def probably_merged(self) -> list[ChangeReport]:
        return [c for c in self.changes if c.status == PROBABLE]

    @property
    def verdict(self) -> str:
        """ok | review (a probable merge, or a region where the series' effect changed) | failed"""
        if self.status in ("conflict", MERGED, "stack-conflict"):
            return "failed"
        return "review" if self.probably_merged or self.tree_identity.regions else "ok"

    def to_json(self) -> dict:
        first = self.first_failure
        return {"ok": self.ok, "status": self.status, "verdict": self.verdict, "verdict_line": verdict_line(self),
                "old": self.old, "onto": self.onto, "relation": self.relation,
                "first_failure": dataclasses.asdict(first) if first else None,
                "failures": [dataclasses.asdict(c) for c in self.changes if c.failed],
                "merged_upstream": [dataclasses.asdict(c) for c in self.changes if c.status == MERGED],
                "probably_merged": [dataclasses.asdict(c) for c in self.probably_merged],
                "tree_identity": self.tree_identity.to_json(), "changes": [dataclasses.asdict(c) for c in self.changes],
                "range_diff": self.range_diff, "patches": self.patches, "notes": self.notes, "stacks": self.stacks}


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
                                   sdist=pin.sdist if pin.sdist and target.base.tree == pin.sdist.tree else None)
    if target.sdist is not None and target.build is not None:
        return dataclasses.replace(pin, commit=None, tag=target.tag, sdist=target.sdist)
    return None


def _old_base(pin: Pin, opts: RebaseOptions, log) -> Base | None:
    hit = obtain.cached(pin, "git") or obtain.cached(pin, "sdist")
    if hit:
        return hit
    return obtain.obtain(pin, opts.source, opts.git_url, opts.sdist_file, log)


def _render_commits(repo: git.Repo, series: Series, base: Base, pin: Pin) -> list[str]:
    commits = render_series(series, lambda p: git.read_blob(repo, base.sha, p),
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
    onto_info = {"commit": target.commit, "tag": target.tag, "url": target.url, "source": target.base.source,
                 "tree": target.base.tree, "build": target.build, "origin": target.origin}
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
    with contextlib.suppress(PortError):
        names = [n.name for n in series_mod.read_series(opts.places.patches_dir)]
    cache = obtain.cache_repo()
    notes = []
    old_base = None
    try:
        old_base = _old_base(pin, opts, log)
    except PortError as err:
        notes.append(f"old base {pin.short} unavailable ({err.message}): no old lines, no range-diff")
    old_reports, seen = [], {}
    if old_base is not None:
        old_reports = analyse(series, lambda p: git.read_blob(cache, old_base.sha, p),
                              pin.short, {"pin": pin}, names, seen=seen)
    baseline = seen if old_reports and not any(r.failed for r in old_reports) else None
    new_pin = new_pin or dataclasses.replace(pin, commit=None, tag=target.tag, sdist=None)
    reports = analyse(series, lambda p: git.read_blob(cache, target.base.sha, p),
                      target.label, {"pin": new_pin}, names, baseline)
    old_lines = {r.change: r.line for r in old_reports if r.status == "ok"}
    for r in reports:
        r.old_line = old_lines.get(r.change)

    def outcome(ok, status, **kw) -> Outcome:
        return Outcome(ok=ok, status=status, old=old_info, onto=onto_info, relation=rel,
                       changes=reports, notes=notes, **kw)

    if old_reports and baseline is None:
        notes.append(f"the series does not render at the old base {pin.short}: no look for "
                     "changes upstream made in its own words")

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
    tree_identity = identity.not_run(f"the old base {pin.short} is unavailable")
    if old_base is not None:
        try:
            old_shas = _render_commits(cache, series, old_base, pin)
            range_diff = git.run(cache, "range-diff", "--no-color", f"{old_base.sha}..{old_shas[-1]}",
                                 f"{target.base.sha}..{new_shas[-1]}")
            tree_identity = identity.check(cache, old_base.sha, old_shas, target.base.sha, new_shas,
                                           _commit_files(series, reports))
        except PortError as err:
            why = err.message
            notes.append(f"no range-diff: the old series does not render at {pin.short} ({why})")
            tree_identity = identity.not_run(f"the old series does not render at {pin.short}")
    review = tree_identity.regions or any(r.status == PROBABLE for r in reports)
    with tempfile.TemporaryDirectory(prefix="mla-port-rebase-") as tmp:
        export_pin = new_pin if _moved_pin(pin, target) else pin
        patches = series_mod.export(cache, target.base.sha, new_shas[-1], Path(tmp), export_pin,
                                    series, [c.slug for c in series.commits])
        if opts.canary or rel == "same":
            if opts.canary and opts.patches_out is not None:
                series_mod.install(Path(tmp), opts.patches_out)
            tried = stacks_mod.try_stacks(cache, series, target.base.sha, target.label,
                                          {"pin": new_pin}, export_pin) if opts.canary else []
            ok = all(t["ok"] for t in tried)
            status = "up-to-date" if not opts.canary else "stack-conflict" if not ok else \
                "canary-review" if review else "canary-ok"
            return outcome(ok and not (opts.canary and review), status, range_diff=range_diff, patches=patches,
                           head=new_shas[-1], stacks=tried, tree_identity=tree_identity)
        pin_path = opts.places.pin_file
        write_pin(pin_path, pin_text(pin, new_pin, pin_path.read_text()))
        series_mod.install(Path(tmp), opts.places.patches_dir)
    if ws.tree.exists():
        try:
            # back to the old base first (the tree is clean and tool-owned: checked above):
            # Workspace.ensure moves the base branch but leaves HEAD on the old series,
            # which pipeline.patch would then refuse as a commit it did not make
            git.run(ws.repo(), "checkout", "-q", BASE_BRANCH)
            if target.commit is None:   # the pin names the imported sdist tree: cache it so
                git.run(cache, "update-ref", obtain.pin_ref("sdist", new_pin), target.base.sha)
            pipeline.patch(pipeline.Options(opts.places, source="git" if target.commit else "sdist",
                                            git_url=target.url), log=log)
        except PortError as err:
            notes.append(f"the pin and patches/ moved, but the work tree {ws.tree} was not "
                         f"re-applied ({err.message}): run `make patch`")
    return outcome(True, "rebased", range_diff=range_diff, patches=patches, tree_identity=tree_identity)


def _commit_files(series: Series, reports: list[ChangeReport]) -> list[dict]:
    """Per series commit: its patch name, title and the files it touches (identity.check)."""
    named = {r.commit: r for r in reports}
    out = []
    for i, c in enumerate(series.commits):
        r = named.get(c.slug)
        out.append({"commit": c.slug, "patch": r.patch if r else f"{i + 1:04d}",
                    "title": r.title if r else c.slug,
                    "files": sorted({ch.file for ch in c.changes})})
    return out


# ---------------------------------------------------------------------------------- text
_LABEL = {"ok": "ok", MERGED: "MERGED", PROBABLE: "REVIEW", "render-error": "ERROR"}


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
    out += identity_lines(o.tree_identity.to_json(), o.status not in ("conflict", MERGED))
    out += [f"note: {n}" for n in o.notes]
    if o.status == "conflict":
        out.append("nothing was written: update the failing anchors in templates/series/*/"
                   "commit.toml (the candidates above are the closest lines upstream), "
                   "then rerun")
    elif o.status == MERGED:
        slugs = sorted({c.commit for c in o.changes if c.status == MERGED})
        out.append("nothing was written: these changes are already upstream; drop them (or "
                   f"the whole folder) from templates/series/ ({', '.join(slugs)}), then rerun")
    elif o.status == "rebased":
        named = o.onto['commit'] or 'tree ' + o.onto['tree'][:12]
        out.append(f"pin moved to {o.onto['tag']} ({named}); patches/ re-exported ({len(o.patches)} patches)")
        if o.verdict == "review":
            out.append("review before you commit them: " + _review_text(o))
    elif o.status == "up-to-date":
        out.append("the pin is already at that commit: nothing to do")
    elif o.status == "canary-ok":
        out.append(f"canary: the series renders at {o.onto['tag']}; nothing was written")
    elif o.status == "canary-review":
        out.append(f"canary: the series renders at {o.onto['tag']}, but review: {_review_text(o)}; nothing was written")
    elif o.status == "stack-conflict":
        bad = [t["stack"] for t in o.stacks if not t["ok"]]
        out.append(f"canary: the series renders at {o.onto['tag']}, but PR stack(s) "
                   f"{', '.join(bad)} do not apply alone there; nothing was written")
    for t in o.stacks:
        what = (f"{len(t['commits'])} commits, +{t['added']}/-{t['removed']}, applies alone "
                "(patches and squashed)" if t["ok"] else f"FAILED: {t['message']}")
        out.append(f"  stack {t['stack']:<12} {what}")
    if o.range_diff:
        out += ["git range-diff (old series vs new series):", o.range_diff]
    return "\n".join(out)


def identity_lines(ident: dict, show_not_run: bool = True) -> list[str]:
    """The tree-identity check's result (identity.Identity.to_json), for the text reports."""
    if not ident["checked"]:
        return [f"tree identity: not checked ({ident['note']})"] if show_not_run else []
    if not ident["regions"]:
        return [f"tree identity: holds (diff(old base, new base) = diff(old patched, new patched) in "
                f"{ident['files']} files of {ident['commits']} commits)"]
    return [f"tree identity: {len(ident['regions'])} region(s) where the series' effect changed:"] + \
        [f"    {identity.describe(r)}" for r in ident["regions"]]


def review_text(probable: list[dict], regions: list[dict]) -> str:
    """What makes a verdict "review", in one line: the first probable merge (ChangeReport as
    JSON) and the first region where the series' effect changed, each with how many there are."""
    parts = []
    if probable:
        c = probable[0]
        hit = c["upstream_lines"][0]
        more = f" (+{len(probable) - 1} more)" if len(probable) > 1 else ""
        parts.append(f"{len(probable)} change(s) probably merged upstream in upstream's own words: "
                     f"{_num(c['patch'])} [series/{c['commit']}] {c['file']}:{hit['line']}: "
                     f"{hit['text']!r}{more}")
    if regions:
        r = regions[0]
        more = f" (+{len(regions) - 1} more)" if len(regions) > 1 else ""
        parts.append(f"{len(regions)} region(s) where the series' effect changed (tree identity): "
                     f"{_num(r['patch'])} [series/{r['commit']}] {r['file']}:{r['new_line']}{more}")
    return "; ".join(parts)


def probable_lines(probable: list[dict]) -> list[str]:
    """One line per added line that already stands near its anchor upstream."""
    return [f"probably merged: {_num(c['patch'])} [series/{c['commit']}] {c['file']}:{h['line']}: "
            f"{h['text']!r} stands near the anchor upstream (the change adds {h['ours']!r})"
            for c in probable for h in c["upstream_lines"]]


def _review_text(o: Outcome) -> str:
    return review_text([dataclasses.asdict(c) for c in o.probably_merged], o.tree_identity.regions)


def verdict_line(o: Outcome) -> str:
    """The outcome in one line, verdict first: OK, REVIEW (and what) or FAILED (and where)."""
    onto = o.onto.get("tag") or (o.onto.get("commit") or o.onto.get("tree") or "")[:12]
    if o.verdict == "review":
        return f"REVIEW on {onto}: {_review_text(o)}"
    if o.verdict == "ok":
        ident = o.tree_identity
        held = (f"tree identity holds in {ident.files} files" if ident.checked
                else f"tree identity not checked: {ident.note}")
        return f"OK on {onto}: all {len(o.changes)} changes found, none merged upstream; {held}"
    first = o.first_failure
    if o.status == "stack-conflict" or first is None:
        bad = [t["stack"] for t in o.stacks if not t["ok"]]
        return f"FAILED on {onto}: {o.status}" + (f" (PR stack(s) {', '.join(bad)})" if bad else "")
    return f"FAILED on {onto}: {o.status}: {_num(first.patch)} [series/{first.commit}] {first.file}: {first.message}"


def _num(patch: str) -> str:
    """A patch's number ("0009") from its file name ("0009-model-...patch") or number."""
    return patch.split("-", 1)[0]

"""The tree-identity check of a rebase: did the series do the same thing on the new upstream?

When it did, diff(old patched, new patched) equals diff(old base, new base): upstream's change,
and nothing of ours. Checked commit by commit: for each series commit and each file it touches,
the diff between the two trees before the commit (upstream's change as the commit meets it)
against the diff between the two trees after it. A region where they differ is where the
commit's effect changed: its hunk landed elsewhere (its anchor moved with text around it, or
another copy of it matched), or upstream's change went under it. The diffs are `git diff -U0`
of the rendered commits (process.git, parsed with unidiff), compared as multisets of their
non-blank `-` and `+` lines, so a hunk split or a blank line slid differently is no difference.

It does not see a change upstream made in its own words next to ours (there the two diffs
agree: both add upstream's line); own_words.py looks for that.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import unidiff

from llamacpp_mla_port.process import git

#: lines kept per side of a region in the report (the count says how many there were)
MAX_REGION_LINES = 20


@dataclass
class Identity:
    checked: bool                     # False: not run (`note` says why)
    commits: int = 0                  # series commits compared
    files: int = 0                    # (commit, file) pairs compared
    regions: list[dict] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def not_run(why: str) -> Identity:
    return Identity(checked=False, note=why)


@dataclass(frozen=True)
class _Line:
    sign: str            # "-" or "+"
    text: str            # without its newline
    hunk: int            # index of its hunk in the file's diff
    old_start: int       # that hunk's first line in the old tree
    new_start: int       # and in the new one


def _diff(repo, old: str, new: str, paths: list[str]) -> dict[str, list[_Line]]:
    """`git diff -U0 old new -- paths`: per file, its non-blank changed lines in order."""
    if old == new or not paths:
        return {}
    text = git.run(repo, "diff", "--no-color", "--no-renames", "--no-ext-diff", "-U0",
                   old, new, "--", *paths, text=False).decode("utf-8", "surrogateescape")
    out: dict[str, list[_Line]] = {}
    for pf in unidiff.PatchSet(text):
        path = pf.target_file[2:] if pf.target_file.startswith("b/") else pf.source_file[2:]
        lines = out.setdefault(path, [])
        for h, hunk in enumerate(pf):
            for ln in hunk:
                if (ln.is_added or ln.is_removed) and ln.value.strip():
                    lines.append(_Line("+" if ln.is_added else "-", ln.value.rstrip("\r\n"), h,
                                       hunk.source_start, hunk.target_start))
    return out


def _unmatched(mine: list[_Line], theirs: list[_Line]) -> list[_Line]:
    """The lines of `mine` that `theirs` does not account for (as multisets of sign+text)."""
    extra = Counter((ln.sign, ln.text) for ln in mine) - Counter((ln.sign, ln.text) for ln in theirs)
    out = []
    for ln in mine:
        if extra[(ln.sign, ln.text)] > 0:
            extra[(ln.sign, ln.text)] -= 1
            out.append(ln)
    return out


def _regions(lines: list[_Line]) -> list[list[_Line]]:
    groups: dict[int, list[_Line]] = {}
    for ln in lines:
        groups.setdefault(ln.hunk, []).append(ln)
    return list(groups.values())


def _shown(lines: list[_Line]) -> list[str]:
    shown = [f"{ln.sign}{ln.text}" for ln in lines[:MAX_REGION_LINES]]
    if len(lines) > MAX_REGION_LINES:
        shown.append(f"... ({len(lines) - MAX_REGION_LINES} more lines)")
    return shown


def check(repo, old_base: str, old_shas: list[str], new_base: str, new_shas: list[str],
          commits: list[dict]) -> Identity:
    """`commits`: per series commit, in order, {"commit": slug, "patch": name, "title": ...,
    "files": [paths it touches]}; `old_shas`/`new_shas` the series rendered at each base."""
    if len(old_shas) != len(commits) or len(new_shas) != len(commits):
        return not_run("the series rendered at the two bases does not have the same commits")
    paths = sorted({f for c in commits for f in c["files"]})
    olds, news = [old_base, *old_shas], [new_base, *new_shas]
    diffs = [_diff(repo, o, n, paths) for o, n in zip(olds, news)]
    result = Identity(checked=True, commits=len(commits))
    for i, c in enumerate(commits):
        before, after = diffs[i], diffs[i + 1]
        for path in sorted(set(c["files"])):
            result.files += 1
            up, ours = before.get(path, []), after.get(path, [])
            series_only, upstream_only = _unmatched(ours, up), _unmatched(up, ours)
            for lines, side in ((series_only, "series"), (upstream_only, "upstream")):
                for group in _regions(lines):
                    first = group[0]
                    result.regions.append({
                        "commit": c["commit"], "patch": c["patch"], "title": c["title"], "file": path,
                        "side": side, "old_line": first.old_start, "new_line": first.new_start,
                        "lines": _shown(group), "count": len(group)})
    return result


def describe(region: dict) -> str:
    """One line for a region: where, and what differs."""
    what = ("the series' diff has lines upstream's has not" if region["side"] == "series"
            else "upstream's diff has lines the series' has not")
    lines = " | ".join(region["lines"][:4]) + (" | ..." if region["count"] > 4 else "")
    return (f"{region['patch'].split('-', 1)[0]} [series/{region['commit']}] {region['file']}:{region['new_line']} "
            f"(was {region['old_line']}): {what}: {lines}")

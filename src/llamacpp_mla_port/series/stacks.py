"""PR stacks: the series grouped into the pull requests upstream would get.

templates/port.toml [stacks.NAME] names them in order; every commit.toml says which one it
belongs to (`stack = "NAME"`, series/spec.py checks). A stack is rendered ALONE on a base (only its
commits, in series order; a stacked PR on the head of the stacks in its `depends`), so a stack
that leans on another stack's text fails here, naming the stack and the anchor. Each rendered
stack comes in two forms, both byte-reproducible: its commits as a format-patch series, and one
squashed commit (what upstream's squash-merge makes of the PR). `check_applies` re-applies the
exported patches with `git apply` (no fuzz) onto the base in a private index and compares the
tree with the rendered one.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import PatchApplyError, PortError, ProcessError, SeriesError
from llamacpp_mla_port.series import gitseries as series_mod
from llamacpp_mla_port.series.render import RenderedCommit, render_series
from llamacpp_mla_port.series.spec import Series, Stack
from llamacpp_mla_port.source.pin import Pin

SQUASHED = "squashed.patch"


@dataclass
class RenderedStack:
    stack: Stack
    base: str                    # the base commit the stack was rendered on (with its depends)
    commits: list[RenderedCommit]
    shas: list[str]
    squashed: str                # the one-commit form: parent = base, tree = the stack's head

    @property
    def head(self) -> str:
        return self.shas[-1]


def squash_message(stack: Stack, commits: list[RenderedCommit]) -> str:
    """The squashed commit's message: the stack's title, then one line per folded commit
    (the shape of upstream's squash-merge messages)."""
    if len(commits) == 1:                    # the commit's own body under the stack's title
        return stack.title + "\n" + commits[0].message.partition("\n")[2]
    subjects = [c.message.split("\n", 1)[0] for c in commits]
    return stack.title + "\n\n" + "".join(f"* {s}\n" for s in subjects)


def render_stack(repo: git.Repo, series: Series, stack: Stack, base_sha: str, base_label: str,
                 extra_vars: dict) -> RenderedStack:
    """Render `stack`'s commits alone on `base_sha` (on the stacks it depends on, when it
    names some) and commit them (and the squashed form) in `repo`; a failure names the stack."""
    based_on = series.base_of(stack)
    if based_on:     # a stacked PR: its base is the head of the PRs it is based on
        under = dataclasses.replace(stack, name="+".join(s.name for s in based_on), depends=(),
                                    commits=series.only(*based_on).slugs())
        base_sha = render_stack(repo, series, under, base_sha, base_label, extra_vars).head
        base_label = f"{base_label} + {under.name}"
    alone = series.only(stack)
    try:
        commits = render_series(alone, lambda p: git.read_blob(repo, base_sha, p),
                                base_label=base_label, extra_vars=extra_vars)
    except PortError as err:
        raise type(err)(f"PR stack {stack.name!r} does not render alone on {base_label}: "
                        f"{err.message}",
                        "a stack may anchor only on upstream text, its own commits and the "
                        "stacks it names in `depends`: move the commit it leans on into the "
                        "stack, add that stack to `depends`, or re-anchor the change "
                        "(templates/port.toml [stacks], commit.toml `stack`)") from None
    shas = series_mod.commit_rendered(repo, base_sha, commits, series)
    tree = git.run(repo, "rev-parse", f"{shas[-1]}^{{tree}}")
    squashed = git.run(repo, "commit-tree", tree, "-p", base_sha, "-F", "-", input=squash_message(stack, commits),
                       env=series_mod.series_env(series))
    return RenderedStack(stack, base_sha, commits, shas, squashed)


def render_stacks(repo: git.Repo, series: Series, base_sha: str, base_label: str,
                  extra_vars: dict, names: list[str] | None = None) -> list[RenderedStack]:
    return [render_stack(repo, series, st, base_sha, base_label, extra_vars)
            for st in series.stacks if names is None or st.name in names]


def export_stack(repo: git.Repo, rs: RenderedStack, out_dir: Path, pin: Pin,
                 series: Series) -> dict:
    """<out_dir>/patches/ (the stack's series, series + manifest.json) and
    <out_dir>/squashed.patch; returns what was written."""
    patches = out_dir / "patches"
    if patches.exists():
        for p in patches.iterdir():
            p.unlink()
    names = series_mod.export(repo, rs.base, rs.head, patches, pin, series, [c.slug for c in rs.commits])
    squashed = git.run(repo, "format-patch", "--zero-commit", "--no-signature", "--full-index",
                       "--subject-prefix=PATCH", "--stat=80", "--no-color", "--no-binary", "--stdout", "-1",
                       rs.squashed, env=series_mod.series_env(series), text=False)
    (out_dir / SQUASHED).write_bytes(squashed)
    return {"patches": names, "squashed": SQUASHED}


def check_applies(repo: git.Repo, base_sha: str, patches: list[Path], expected_tree: str) -> None:
    """`git apply --cached` each patch in order onto `base_sha` in a private index (exact
    context, no fuzz); the resulting tree must be `expected_tree`."""
    with tempfile.TemporaryDirectory(prefix="mla-port-stack-") as tmp:
        env = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        git.run(repo, "read-tree", base_sha, env=env)
        for p in patches:
            try:
                git.run(repo, "apply", "--cached", "--whitespace=nowarn", str(p), env=env)
            except ProcessError as err:
                raise PatchApplyError(f"{p.name} does not apply alone on {base_sha[:12]}: "
                                      f"{git.error_text(err)}",
                                      "the stack leans on a commit of another stack: move that "
                                      "commit into it, or re-anchor the change",
                                      {"patch": p.name}) from None
        got = git.run(repo, "write-tree", env=env)
    if got != expected_tree:
        raise SeriesError(f"the stack's patches applied on {base_sha[:12]} give tree {got[:12]}, "
                          f"not the rendered {expected_tree[:12]}",
                          "a patch was edited by hand or exported stale: rerun `make pr`")


def verify(repo: git.Repo, rs: RenderedStack, out_dir: Path) -> dict:
    """Both forms of an exported stack apply alone on its base and give the rendered tree."""
    tree = git.run(repo, "rev-parse", f"{rs.head}^{{tree}}")
    check_applies(repo, rs.base, series_mod.read_series(out_dir / "patches"), tree)
    check_applies(repo, rs.base, [out_dir / SQUASHED], tree)
    return {"applies_alone": True, "tree": tree}


def diffstat(repo: git.Repo, base: str, head: str) -> dict:
    """Lines added and removed, and files, of base..head."""
    added = removed = 0
    files = []
    for line in git.run(repo, "diff", "--numstat", f"{base}..{head}").splitlines():
        a, r, path = line.split("\t", 2)
        added += int(a) if a != "-" else 0
        removed += int(r) if r != "-" else 0
        files.append(path)
    return {"added": added, "removed": removed, "files": files}


def try_stacks(repo: git.Repo, series: Series, base_sha: str, base_label: str, extra_vars: dict,
               pin: Pin) -> list[dict]:
    """The canary's stack check: every stack rendered, exported and applied (both forms)
    alone on `base_sha`; one entry per stack, the first failure's message when it fails."""
    out = []
    for st in series.stacks:
        entry: dict = {"stack": st.name, "title": st.title, "commits": list(st.commits)}
        try:
            rs = render_stack(repo, series, st, base_sha, base_label, extra_vars)
            with tempfile.TemporaryDirectory(prefix="mla-port-stack-") as tmp:
                export_stack(repo, rs, Path(tmp), pin, series)
                verify(repo, rs, Path(tmp))
            entry.update(ok=True, head=rs.head, squashed=rs.squashed,
                         **{k: v for k, v in diffstat(repo, rs.base, rs.head).items() if k != "files"})
        except PortError as err:
            entry.update(ok=False, message=err.message, hint=err.hint)
        out.append(entry)
    return out

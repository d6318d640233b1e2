"""Synthetic upstream drift for the rebase and pr tests (a helper module, not tests).

The "upstream" is a bare repository borrowing the cache's objects (alternates), so each
drift commit costs a few blobs; the cache is a `--mirror --local` copy of the user cache
(hard links), so nothing here writes to the real one. The series is a small one of the
tests' own (a gguf-py list entry and a C++ replace), independent of templates/ in flux, or
the project's own: its drift is derived from the series at test time (`met_changes` and the
edits after it), so a renumbered or rewritten series still gets the same kinds of drift.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port.process import git
from llamacpp_mla_port.cli import main
from llamacpp_mla_port.series import pipeline
from llamacpp_mla_port.series.anchors import Located, tokens
from llamacpp_mla_port.series.render import Step, walk_series
from llamacpp_mla_port.series.spec import Change, load_series
from llamacpp_mla_port.source import obtain
from llamacpp_mla_port.source.pin import load_pin
from llamacpp_mla_port.upstreaming import own_words

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"

GGUF = "gguf-py/gguf/constants.py"
GRAPH = "src/llama-graph.cpp"
Q_A_NORM = "        MODEL_TENSOR.ATTN_Q_A_NORM,\n"
K_SET_INPUT = "void llm_graph_input_attn_k::set_input(const llama_ubatch * ubatch) {\n"
MASK = "    mctx->set_input_kq_mask(self_kq_mask, ubatch, cparams.causal_attn);\n"
ADDED_TENSORS = "        MODEL_TENSOR.ATTN_KV_A_MQA,\n        MODEL_TENSOR.ATTN_KV_A_NORM,\n"
GUARDED_MASK = ("    if (self_kq_mask) {\n"
                "        mctx->set_input_kq_mask(self_kq_mask, ubatch, cparams.causal_attn);\n"
                "    }\n")

COMMIT_10 = f'''stack = "gguf-demo"

[[change]]
file = "{GGUF}"
within = """
    MODEL_ARCH.DFLASH: [
"""
within_end = """
    ],
"""
anchor = """
{Q_A_NORM}"""
placement = "after"
template = "tensors.py.j2"
'''
COMMIT_20 = f'''stack = "graph-demo"

[[change]]
file = "{GRAPH}"
within = """
{K_SET_INPUT}"""
within_end = """
}}
"""
anchor = """
{MASK}"""
placement = "replace"
template = "mask.cpp.j2"
'''


# ------------------------------------------------------------------------------ the world
class World:
    def __init__(self, root: Path, base_sha: str, up: Path):
        self.root, self.base, self.up = root, base_sha, up

    def read(self, rev: str, path: str) -> str:
        return git.read_blob(git.Repo(self.up), rev, path).decode()

    def commit(self, name: str, edits: dict, parent: str | None = None, orphan=False) -> str:
        """A commit on refs/heads/<name> of the upstream: `edits` maps path -> text -> text."""
        parent = parent or self.base
        repo = git.Repo(self.up)
        index = {"GIT_INDEX_FILE": str(self.root / f"index-{name}")}
        git.run(self.up, "read-tree", parent, env=index)
        for path, edit in edits.items():
            new = edit(self.read(parent, path))
            blob = git.store_blob(repo, new.encode())
            git.run(self.up, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}",
                    env=index)
        tree = git.run(self.up, "write-tree", env=index)
        parents = [] if orphan else ["-p", parent]
        sha = git.run(self.up, "commit-tree", tree, *parents, "-m", f"upstream: {name}",
                      env=git.identity_env("Upstream", "u@x", "2026-10-02T00:00:00Z"))
        git.run(self.up, "update-ref", f"refs/heads/{name}", sha)
        return sha


def make_world(tmp_path_factory, pin, sdist_tarball):
    """Generator for a module-scoped `world` fixture: the cache copy and the upstream."""
    real = obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)
    root = tmp_path_factory.mktemp("rebase")
    git.run(root, "clone", "-q", "--mirror", "--local", obtain.cache_repo().git_dir,
            str(root / "cache" / "base.git"))
    up = root / "upstream.git"
    git.run(root, "init", "-q", "--bare", str(up))
    (up / "objects" / "info" / "alternates").write_text(
        str(root / "cache" / "base.git" / "objects") + "\n")
    git.run(up, "update-ref", "refs/heads/main", real.sha)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLAMACPP_MLA_PORT_CACHE", str(root / "cache"))
        yield World(root, real.sha, up)


DEMO_STACKS = '''
[stacks.gguf-demo]
title = "gguf-py : list two more DFLASH tensors"

[stacks.graph-demo]
title = "graph : guard the K-only mask"
'''
#: templates/stacks/graph-demo.md: no summary, one claim
DEMO_PROSE = {"graph-demo": "## Evidence\n\n- the demo's claim\n  `echo demo-figure 0.5`\n"}


def demo_port_toml() -> str:
    """The project's port.toml with its PR stacks replaced by the demo's two (one commit each)."""
    lines = (TEMPLATES_DIR / "port.toml").read_text().split("\n")
    cut = next(i for i, ln in enumerate(lines) if ln.startswith("[stacks."))
    while cut and lines[cut - 1].startswith("#"):
        cut -= 1
    return "\n".join(lines[:cut]).rstrip() + "\n" + DEMO_STACKS


def pinned_at(pin_text: str, commit: str) -> str:
    """The project's pin.toml naming `commit` (its other tables kept): the real pin may name
    its tree by tag and sdist tree id only."""
    up = pin_text.index("[upstream]\n") + len("[upstream]\n")
    head, rest = pin_text[:up], pin_text[up:]
    rest = re.sub(r'^commit = "[0-9a-f]{40}"\n', "", rest, count=1, flags=re.M)
    return head + f'commit = "{commit}"\n' + rest


def make_templates(dst: Path, pin_commit: str) -> Path:
    """A two-commit series of our own, pinned at `pin_commit` (the sdist table kept)."""
    dst.mkdir(parents=True)
    (dst / "port.toml").write_text(demo_port_toml())
    (dst / "stacks").mkdir()
    for name, text in DEMO_PROSE.items():
        (dst / "stacks" / f"{name}.md").write_text(text)
    real_pin = (TEMPLATES_DIR / "pin.toml").read_text()
    (dst / "pin.toml").write_text(pinned_at(real_pin, pin_commit))
    for slug, toml, name, body, msg in (
            ("10-gguf-py-demo", COMMIT_10, "tensors.py.j2", ADDED_TENSORS,
             "gguf-py : list two more DFLASH tensors\n\nThe demo body says why.\n"),
            ("20-graph-demo", COMMIT_20, "mask.cpp.j2", GUARDED_MASK,
             "graph : guard the K-only mask\n\nThe demo body says why.\n")):
        folder = dst / "series" / slug
        folder.mkdir(parents=True)
        (folder / "commit.toml").write_text(toml)
        (folder / name).write_text(body)
        (folder / "message.txt.j2").write_text(msg)
    return dst


def _complete_cache_history(world: World) -> None:
    """Drop the cache's shallow marks: every commit here has its parents in the cache.

    The engine fetches with --depth 1, which marks the cache shallow, and `git clone
    --local` of a shallow repository silently falls back to an empty clone, so
    Workspace._create (series/worktree.py) fails once any git fetch happened (an engine bug, reported). The
    synthetic history is complete, so the marks are simply wrong here.
    """
    (world.root / "cache" / "base.git" / "shallow").unlink(missing_ok=True)


def copy_real_templates(dst: Path, pin_commit: str) -> Path:
    """The project's own templates/ (the real series), pinned at `pin_commit`."""
    shutil.copytree(TEMPLATES_DIR, dst)
    pin = dst / "pin.toml"
    pin.write_text(pinned_at(pin.read_text(), pin_commit))
    return dst


class Project:
    """templates/, patches/ and a tool work tree, patched at `pin_commit`; the tests' own
    two-commit series, or with `real=True` the project's series."""

    def __init__(self, world: World, root: Path, pin_commit: str, work_tree=True, real=False):
        self.world, self.root = world, root
        self.templates = (copy_real_templates if real else make_templates)(root / "templates", pin_commit)
        self.patches = root / "patches"
        self.work = root / "work"
        obtain.fetch_git(load_pin(self.templates / "pin.toml"), str(world.up))
        _complete_cache_history(world)
        opts = pipeline.Options(self.places(), source="git", git_url=str(world.up))
        if work_tree:
            pipeline.patch(opts, log=lambda *_: None)
        else:       # patches/ only: rendered in the cache repository, no work tree checked out
            pin = load_pin(self.templates / "pin.toml")
            base = obtain.obtain(pin, "git", str(world.up), log=lambda *_: None)
            pipeline.export_fresh(pipeline.render(opts, obtain.cache_repo(), pin, base), self.patches)

    def places(self) -> project.Places:
        """The places of a verb given this project's --templates-dir, --patches-dir and --work-dir."""
        return project.Places().with_flags(templates_dir=self.templates, patches_dir=self.patches,
                                           work_dir=self.work)

    def rebase(self, capsys, *args: str) -> tuple[int, str, str]:
        rc = main(["rebase", "--templates-dir", str(self.templates), "--patches-dir",
                   str(self.patches), "--work-dir", str(self.work), *args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    def canary(self, capsys, canary_dir: Path, *args: str) -> tuple[int, dict, str]:
        """The full canary through the CLI: (exit code, JSON report, the stage lines)."""
        rc, out, err = self.rebase(capsys, "--canary", "--prove", "--json", "--canary-dir",
                                   str(canary_dir), *args)
        return rc, json.loads(out), err

    def snapshot(self) -> dict:
        snap = {"pin": (self.templates / "pin.toml").read_bytes(),
                "patches": {p.name: p.read_bytes() for p in sorted(self.patches.iterdir())}}
        tree = self.work / "llama.cpp"
        if tree.exists():
            snap["head"] = git.run(tree, "rev-parse", "HEAD")
            snap["branch"] = git.run(tree, "rev-parse", "--abbrev-ref", "HEAD")
            snap["status"] = git.run(tree, "status", "--porcelain")
            snap["state"] = (tree / ".git" / "llamacpp-mla-port.json").read_text()
        return snap


# ------------------------------------------------------------------------------ the real series
# Drift of the project's own series, derived from it at test time (never a fixed patch number,
# subject or anchor): the changes are met as the engine's lenient walk meets them at the base.
@dataclass(frozen=True)
class Met:
    """A change of the series as the walk meets it at the pinned base."""
    index: int           # the commit's place in the series (0: the first patch)
    slug: str
    change: Change
    rendered: str        # what it inserts (or what replaces its anchor)
    base: str            # its file at the base (where the anchor stands once, as in the walk's text)

    @property
    def anchor_line(self) -> str:
        return self.change.anchor


def met_changes(templates: Path, world: World) -> list[Met]:
    """Every change the series walk locates at the base with a one-line literal anchor (no
    `within`) that stands once in its file, before the series and as the change meets it, and
    that no other change's patterns contain: moving or rewording that line moves or breaks this
    change alone."""
    series = load_series(templates)
    pin = load_pin(templates / "pin.toml")
    up = git.Repo(world.up)
    steps: list[Step] = []
    walk_series(series, lambda p: git.read_blob(up, world.base, p), pin.short, {"pin": pin},
                decide=lambda st: steps.append(st) or True)
    patterns = [(ch.origin, p) for c in series.commits for ch in c.changes
                for p in (ch.anchor, ch.within, ch.within_end) if p]
    out = []
    for st in steps:
        ch = st.change
        if not isinstance(st.where, Located) or ch.regex or ch.within or st.rendered is None:
            continue
        if ch.anchor.count("\n") != 1 or not ch.anchor.endswith("\n") or not ch.anchor.strip():
            continue
        base = world.read(world.base, ch.file)
        if base.count(ch.anchor) != 1 or st.text.count(ch.anchor) != 1:
            continue
        if any(ch.anchor.strip() in p for origin, p in patterns if origin != ch.origin):
            continue
        out.append(Met(st.commit_index, st.commit.slug, ch, st.rendered, base))
    return out


def keyed_lines(met: Met) -> list[str]:
    """The lines the change adds that own_words compares (code that says something)."""
    replaced = met.anchor_line if met.change.placement == "replace" else ""
    return [ln for ln in own_words.added_lines(met.rendered, replaced)
            if own_words.key(ln, met.change.file) is not None]


def respaced(line: str) -> str:
    """The line as another author might space it: a blank only between two names or numbers."""
    toks = tokens(line)
    out = toks[0]
    for a, b in zip(toks, toks[1:]):
        out += (" " if (a[-1].isalnum() or a[-1] == "_") and (b[0].isalnum() or b[0] == "_") else "") + b
    return out


def in_other_words(met: Met) -> tuple[str, str]:
    """Upstream lands the change's first code line in its own words: without our comment, spaced
    its way, right at the anchor (above it for a `before` change, below it otherwise). Returns
    (the new file, the line upstream wrote)."""
    ours = keyed_lines(met)[0]
    indent = met.anchor_line[:len(met.anchor_line) - len(met.anchor_line.lstrip())]
    theirs = indent + respaced(ours.strip())
    i = met.base.index(met.anchor_line)
    at = i if met.change.placement == "before" else i + len(met.anchor_line)
    return met.base[:at] + theirs + "\n" + met.base[at:], theirs.strip()


def moved_to_the_end(met: Met) -> str:
    """The anchor line cut out and put at the end of its file: the change follows it there."""
    return met.base.replace(met.anchor_line, "", 1) + met.anchor_line


def reworded(line: str) -> str | None:
    """The line as upstream might reword it, every token kept: the operands of its first `&&`
    or `||` swapped, else the two sides of its first `==` or `!=`; None when it has neither
    (`renamed` then)."""
    indent, s = line[:len(line) - len(line.lstrip())], line.strip()
    for op in (" && ", " || ", " == ", " != "):
        if op not in s:
            continue
        i = s.index(op)
        left, right = s[:i], s[i + len(op):]
        a = max(left.rfind("(") + 1, left.rfind(",") + 1,
                *(left.rfind(kw) + len(kw) for kw in ("return ", " = ") if kw in left))
        ends = [j for j in (right.find(")"), right.find(","), right.find(";")) if j >= 0]
        b = min(ends) if ends else len(right)
        x, y = left[a:], right[:b]
        if not x.strip() or not y.strip():
            continue
        lead, trail = x[:len(x) - len(x.lstrip())], y[len(y.rstrip()):]
        new = left[:a] + lead + y.strip() + op + x.strip() + trail + right[b:]
        if new != s:
            return indent + new + "\n"
    return None


def renamed(line: str) -> str | None:
    """The line with its longest name renamed (`_v2` added), as upstream renames a variable."""
    names = sorted((t for t in tokens(line) if t[0].isalpha() or t[0] == "_"), key=len, reverse=True)
    if not names or len(names[0]) < 4:
        return None
    return re.sub(rf"\b{re.escape(names[0])}\b", names[0] + "_v2", line, count=1)


def comment(path: str, text: str) -> str:
    """A comment line in the file's own syntax."""
    if path.endswith(".md"):
        return f"<!-- {text} -->\n"
    hash_style = path.endswith((".py", ".sh", ".cmake", ".txt", ".toml")) or path.rsplit("/", 1)[-1] in (
        "CMakeLists.txt", "Makefile")
    return f"# {text}\n" if hash_style else f"// {text}\n"


def moved_on(text: str, path: str, above: list[str]) -> str:
    """Upstream moved on: three comment lines at the top of the file and one right above each
    line of `above` (anchors no other pattern contains), so every anchor in it moves."""
    for line in above:
        text = text.replace(line, comment(path, "upstream moved on, above an anchor") + line, 1)
    return "".join(comment(path, f"upstream moved on ({n})") for n in range(3)) + text

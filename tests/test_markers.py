"""The suite's markers (tests/conftest.py): a test that uses the build is marked `build`, one
that uses llama.cpp's source gets `tree`, and a test marked neither runs where llama.cpp cannot
be had, so `make test-fast` cannot quietly need it."""

from __future__ import annotations

import time

import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port.errors import NetworkError
from llamacpp_mla_port.source import obtain
from llamacpp_mla_port.source.pin import load_pin
from tests.conftest import marker_problems
from tests.helpers import PIN_FILE


class _Item:
    """What marker_problems reads of a collected test."""

    def __init__(self, nodeid: str, fixtures: tuple[str, ...], marks: tuple[str, ...] = ()):
        self.nodeid, self.fixturenames = nodeid, list(fixtures)
        self.marks = [getattr(pytest.mark, m) for m in marks]

    def iter_markers(self):
        return iter([m.mark for m in self.marks])

    def add_marker(self, mark):
        self.marks.append(mark)


def test_a_test_using_the_build_must_say_so_and_one_using_the_tree_is_marked():
    unmarked = _Item("t::uses_build", ("tmp_path", "llama_build", "patched_tree"))
    marked = _Item("t::marked", ("llama_build",), ("build",))
    tree = _Item("t::tree", ("sdist_tarball",))
    neither = _Item("t::neither", ("tmp_path",))
    assert marker_problems([unmarked, marked, tree, neither]) == [
        "t::uses_build uses llama_build: mark it @pytest.mark.build"]
    assert [m.name for m in tree.iter_markers()] == ["tree"]
    assert list(neither.iter_markers()) == [] and [m.name for m in marked.iter_markers()] == ["build"]


def test_an_unmarked_test_cannot_reach_llama_cpp():
    assert "no-llama-cpp-cache" in str(project.cache_dir())
    assert not project.sdist_cache().exists() or not any(project.sdist_cache().iterdir())
    pin = load_pin(PIN_FILE)
    t0 = time.monotonic()
    with pytest.raises(NetworkError, match="127.0.0.1:9"):
        obtain.sdist_archive(pin, log=lambda *_: None)
    assert time.monotonic() - t0 < 30


@pytest.mark.tree
def test_a_marked_test_keeps_the_users_cache(tmp_path):
    # the control: a `tree` test sees the cache the run was given, not the empty one
    assert "no-llama-cpp-cache" not in str(project.cache_dir())

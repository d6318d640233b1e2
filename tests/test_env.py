"""One environment prefix, MLA_PORT_*; the old LLAMACPP_MLA_PORT_* names are still read."""

from __future__ import annotations

from pathlib import Path

from llamacpp_mla_port import project
from llamacpp_mla_port.source import obtain


def test_the_new_prefix_wins_and_the_old_one_is_still_read(monkeypatch, tmp_path):
    monkeypatch.delenv("MLA_PORT_CACHE", raising=False)
    monkeypatch.setenv("LLAMACPP_MLA_PORT_CACHE", str(tmp_path / "old"))
    assert project.cache_dir() == tmp_path / "old"
    monkeypatch.setenv("MLA_PORT_CACHE", str(tmp_path / "new"))
    assert project.cache_dir() == tmp_path / "new"
    monkeypatch.delenv("MLA_PORT_PYPI", raising=False)
    monkeypatch.setenv("LLAMACPP_MLA_PORT_PYPI", "http://old.example/pypi/")
    assert obtain.pypi_json_url("x") == "http://old.example/pypi/x/json"
    monkeypatch.setenv("MLA_PORT_PYPI", "http://new.example/pypi")
    assert obtain.pypi_json_url("x") == "http://new.example/pypi/x/json"


def test_unset_means_the_default(monkeypatch):
    for name in ("MLA_PORT_ZZ", "LLAMACPP_MLA_PORT_ZZ"):
        monkeypatch.delenv(name, raising=False)
    assert project.env("ZZ", "d") == "d" and project.env("ZZ") is None
    monkeypatch.setenv("MLA_PORT_CACHE", "")
    monkeypatch.setenv("LLAMACPP_MLA_PORT_CACHE", "/x")
    assert project.cache_dir() == Path("/x")          # an empty new name counts as unset

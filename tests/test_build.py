"""One build configuration: `make build`, the tests, smoke, bench, pr and the canary configure
work/build the same way, so `make patch build` then `make test` compiles the tree once."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamacpp_mla_port import build as build_mod
from llamacpp_mla_port.bench.run import BENCH_TARGETS
from llamacpp_mla_port.proof.smoke import SMOKE_TARGETS
from llamacpp_mla_port.upstreaming.pr import PR_TARGETS


@pytest.fixture
def fake_cmake(tmp_path, monkeypatch):
    """ensure_build over a fake tree: records each configure and 'builds' empty binaries."""
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text("project(x)\n")
    configures: list[list[str]] = []

    def run_logged(cmd, log_path, stage, echo, env=None):
        if cmd[:2] == ["cmake", "-S"]:
            configures.append(cmd)
            (Path(cmd[cmd.index("-B") + 1]) / "CMakeCache.txt").write_text("")
            return
        bin_dir = Path(cmd[2]) / "bin"
        bin_dir.mkdir(exist_ok=True)
        for i, arg in enumerate(cmd):
            if arg == "--target":
                (bin_dir / cmd[i + 1]).write_text("")

    monkeypatch.setattr(build_mod, "_run_logged", run_logged)
    monkeypatch.setattr(build_mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    return tree, tmp_path / "build", configures


def test_every_caller_shares_one_configuration(fake_cmake):
    tree, build_dir, configures = fake_cmake
    build_mod.ensure_build(tree, build_dir, build_mod.DEFAULT_TARGETS, echo=False)     # make build
    build_mod.ensure_build(tree, build_dir, build_mod.DEFAULT_TARGETS, rpc=True, echo=False)  # tests
    build_mod.ensure_build(tree, build_dir, SMOKE_TARGETS, echo=False)                 # make smoke
    build_mod.ensure_build(tree, build_dir, BENCH_TARGETS, echo=False)                 # make bench
    build_mod.ensure_build(tree, build_dir, PR_TARGETS, rpc=True, echo=False)          # make pr
    assert len(configures) == 1, configures
    assert "-DGGML_RPC=ON" in configures[0]
    assert (build_dir / "bin" / "ggml-rpc-server").exists()


def test_a_build_without_rpc_is_another_configuration(fake_cmake):
    # the control: the configure check notices a changed option (so the test above can fail)
    tree, build_dir, configures = fake_cmake
    build_mod.ensure_build(tree, build_dir, build_mod.DEFAULT_TARGETS, echo=False)
    build_mod.ensure_build(tree, build_dir, build_mod.DEFAULT_TARGETS, rpc=False, echo=False)
    assert len(configures) == 2 and "-DGGML_RPC=ON" not in configures[1]
    assert "ggml-rpc-server" not in [a for c in configures for a in c]


def test_the_build_verb_defaults_to_the_shared_configuration():
    import argparse

    from llamacpp_mla_port.commands import build as verb
    parser = argparse.ArgumentParser()
    verb.configure(parser)
    assert parser.parse_args([]).rpc is True
    assert parser.parse_args(["--no-rpc"]).rpc is False


@pytest.mark.parametrize("status", ["applying", "base", None])
def test_build_refuses_a_half_applied_work_tree(tmp_path, capsys, status):
    from llamacpp_mla_port.cli import main
    from llamacpp_mla_port.series.worktree import Workspace
    ws = Workspace(tmp_path / "work")
    ws.state_path.parent.mkdir(parents=True)
    ws.save_state(base="0" * 40, head=None, **({"status": status} if status else {}))
    assert main(["build", "--work-dir", str(ws.work_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"recorded state is {status!r}" in err and "make patch" in err
    assert not ws.build_dir.exists()          # refused before CMake ran


def test_build_accepts_a_tree_the_tool_does_not_own(tmp_path):
    from llamacpp_mla_port.series.worktree import require_applied
    (tmp_path / "llama.cpp" / ".git").mkdir(parents=True)
    require_applied(tmp_path / "llama.cpp")                  # no state file: the user's tree
    ws_state = tmp_path / "llama.cpp" / ".git" / "llamacpp-mla-port.json"
    ws_state.write_text('{"status": "applied", "head": "1"}')
    require_applied(tmp_path / "llama.cpp")

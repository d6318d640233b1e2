"""One resolver for every place (project.Places): flag > environment > the checkout's
default, and one set of tree/build/work flags that every verb spells the same way, the old
spellings kept as aliases (issue 21)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port.cli import COMMANDS, main, module_of
from llamacpp_mla_port.commands.common import SCRATCH_FLAGS, TREE_FLAGS
from llamacpp_mla_port.errors import WorkTreeError

REPO = Path(__file__).resolve().parents[1]
PLACE_ENV = ("WORK_DIR", "TREE", "BUILD", "CANARY_DIR", "CACHE", "PROOF_BIN", "PROJECT")

#: the place flags each verb takes (canonical spellings; TREE_FLAGS has the aliases)
VERB_FLAGS: dict[str, set[str]] = {
    "obtain": {"--work-dir"}, "patch": {"--work-dir"}, "check": {"--work-dir"},
    "build": {"--work-dir", "--tree", "--build-dir"},
    "doctor": set(),
    "loader-table": {"--work-dir", "--tree"},
    "fixtures": {"--work-dir", "--build-dir"},
    "draft-logits": {"--work-dir", "--tree", "--build-dir"},
    "target-features": {"--work-dir", "--tree", "--build-dir"},
    "parity": {"--work-dir", "--tree", "--build-dir"},
    "smoke": {"--work-dir", "--tree", "--build-dir"},
    "prove": {"--work-dir", "--tree", "--build-dir"},
    "bench": {"--work-dir", "--tree", "--build-dir"},
    "draft-length": {"--work-dir", "--tree", "--build-dir"},
    "device-check": {"--work-dir", "--tree", "--build-dir"},
    "pr": {"--work-dir"},            # its --build-dir is the per-commit builds' own dir
    "rebase": {"--work-dir"},
    "harness-diff": {"--work-dir"},
    "upstream-bench": {"--work-dir"},
}
#: verbs with a scratch folder of their own: --scratch-dir, once spelled --work
SCRATCH = {"smoke", "prove", "parity", "device-check"}
#: canonical flag -> the Places property it names
PROPERTY = {"--work-dir": "work_dir", "--tree": "tree", "--build-dir": "build_dir"}


@pytest.fixture
def no_place_env(monkeypatch):
    for name in PLACE_ENV:
        for prefix in (project.ENV_PREFIX, project.OLD_ENV_PREFIX):
            monkeypatch.delenv(prefix + name, raising=False)
    yield monkeypatch


def places(**flags) -> project.Places:
    """The places of a run with `--project REPO` and these flags."""
    return project.Places(project=REPO).with_flags(**flags)


def _parser(verb: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=verb)
    importlib.import_module(module_of(verb)).configure(parser)
    # the test parses the place flags only: the verb's other required arguments are let off
    for action in parser._actions:
        action.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    positionals = ["x" for a in parser._actions if not a.option_strings and a.nargs is None]
    return parser.parse_args(positionals + argv)


def test_the_table_covers_every_verb():
    assert set(VERB_FLAGS) == set(COMMANDS)


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_every_verb_takes_the_canonical_and_the_old_spellings_for_one_place(verb, no_place_env, tmp_path):
    parser = _parser(verb)
    options = parser._option_string_actions
    for flag in VERB_FLAGS[verb]:
        assert flag in options, f"{verb}: no {flag}"
        for spelling in (flag, *TREE_FLAGS[flag]):
            assert options[spelling] is options[flag], f"{verb}: {spelling} is not an alias of {flag}"
            ns = _parse(parser, [spelling, str(tmp_path / "p")])
            assert getattr(project.Places.of(vars(ns), REPO), PROPERTY[flag]) == tmp_path / "p", (verb, spelling)
    # a place flag is declared only through commands/common.add_tree_args, with its aliases
    for action in parser._actions:
        if action.dest in ("work_dir", "tree", "build_dir"):
            canonical = next(f for f, d in PROPERTY.items() if d == action.dest)
            assert action.option_strings == [canonical, *TREE_FLAGS[canonical]], (verb, action.option_strings)
    if verb in SCRATCH:
        for spelling in SCRATCH_FLAGS["--scratch-dir"]:
            assert options[spelling] is options["--scratch-dir"] and options[spelling].dest == "scratch_dir"
            assert _parse(parser, [spelling, "/s"]).scratch_dir == Path("/s")
        assert options["--work-dir"] is not options["--work"]      # the work dir is another place
    else:
        assert "--scratch-dir" not in options and "--work" not in options
        if "--work-dir" in options:      # as before: argparse takes `--work` for --work-dir, unambiguous
            assert _parse(parser, ["--work", "/w"]).work_dir == Path("/w")


def test_the_checkout_defaults(no_place_env):
    p = places()
    assert p.root == REPO
    assert (p.templates_dir, p.patches_dir) == (REPO / "templates", REPO / "patches")
    assert p.work_dir == REPO / "work"
    assert (p.work_tree, p.work_build) == (REPO / "work" / "llama.cpp", REPO / "work" / "build")
    assert (p.tree, p.build_dir) == (p.work_tree, p.work_build)
    assert (p.owned_tree, p.owned_build) == (p.work_tree, p.work_build)
    assert p.canary_dir == REPO / "work-canary"
    assert p.device_bundle == REPO / "work" / "device-bundle"


def test_the_environment_beats_the_checkout(no_place_env, tmp_path):
    mp = no_place_env
    mp.setenv("LLAMACPP_MLA_PORT_WORK_DIR", str(tmp_path / "old"))         # the old prefix is read
    assert places().work_dir == tmp_path / "old"
    mp.setenv("MLA_PORT_WORK_DIR", str(tmp_path / "w"))
    mp.setenv("MLA_PORT_CANARY_DIR", str(tmp_path / "c"))
    mp.setenv("MLA_PORT_CACHE", str(tmp_path / "cache"))
    p = places()
    w = tmp_path / "w"
    assert (p.work_dir, p.tree, p.build_dir) == (w, w / "llama.cpp", w / "build")
    assert p.canary_dir == tmp_path / "c" and project.base_cache() == tmp_path / "cache" / "base.git"
    assert p.device_bundle == REPO / "work" / "device-bundle"    # carried by the device call: the checkout's
    mp.setenv("MLA_PORT_TREE", str(tmp_path / "t"))
    mp.setenv("MLA_PORT_BUILD", str(tmp_path / "b"))
    p = places()
    assert (p.tree, p.build_dir) == (tmp_path / "t", tmp_path / "b")
    # what the tool writes is never redirected by the environment
    assert (p.owned_tree, p.owned_build) == (tmp_path / "w" / "llama.cpp", tmp_path / "w" / "build")


def test_a_flag_beats_the_environment(no_place_env, tmp_path):
    mp = no_place_env
    for name, sub in (("WORK_DIR", "w"), ("TREE", "t"), ("BUILD", "b"), ("CANARY_DIR", "c")):
        mp.setenv("MLA_PORT_" + name, str(tmp_path / "env" / sub))
    p = places(tree=tmp_path / "ft", build_dir=tmp_path / "fb", canary_dir=tmp_path / "fc")
    assert (p.tree, p.build_dir, p.canary_dir) == (tmp_path / "ft", tmp_path / "fb", tmp_path / "fc")
    assert (p.owned_tree, p.owned_build) == (tmp_path / "ft", tmp_path / "fb")
    assert p.work_dir == tmp_path / "env" / "w"
    # an explicit work dir brings its own tree and build, over the ambient $MLA_PORT_TREE/BUILD
    p = places(work_dir=tmp_path / "fw")
    fw = tmp_path / "fw"
    assert (p.work_dir, p.tree, p.build_dir) == (fw, fw / "llama.cpp", fw / "build")
    p = places(templates_dir="t", patches_dir="p")
    assert (p.templates_dir, p.patches_dir) == (Path("t").absolute(), Path("p").absolute())
    with pytest.raises(TypeError):
        places(wrok_dir=tmp_path)


def test_the_run_is_resolved_once_from_the_verbs_flags(no_place_env, tmp_path):
    run = project.Places.of({"work_dir": tmp_path / "w", "tree": None, "json": True}, REPO)
    assert dict(run.flags) == {"work_dir": tmp_path / "w"}          # the place flags given, nothing else
    assert run.work_dir == tmp_path / "w" and run.root == REPO
    assert run.with_flags(tree=tmp_path / "t").work_dir == tmp_path / "w"       # flags on top of the run's
    assert run.with_flags(tree=None) is run
    # cli.main builds the places once and hands them to the verb; the module keeps no run state
    import llamacpp_mla_port.commands.loader_table as verb
    seen = []
    no_place_env.setattr(verb, "run", lambda args, given: seen.append(given) or 0)
    tree = tmp_path / "tree"
    assert main(["--project", str(REPO), "loader-table", "--work", str(tmp_path / "w"), "--tree", str(tree)]) == 0
    assert [(p.root, p.work_dir, p.tree) for p in seen] == [(REPO, tmp_path / "w", tree)]
    assert not [k for k, v in vars(project).items() if isinstance(v, project.Places)]
    assert places().work_dir == REPO / "work"


def test_the_build_view(no_place_env, tmp_path):
    mp = no_place_env
    tree = tmp_path / "t"
    (tree / "include").mkdir(parents=True)
    (tree / "include" / "llama.h").write_text("")
    mp.setenv("MLA_PORT_TREE", str(tree))
    mp.setenv("MLA_PORT_BUILD", str(tmp_path / "b"))
    b = places().build
    assert (b.tree, b.dir) == (tree, tmp_path / "b") and b.require_tree() is b
    assert b.bin("llama-server") == tmp_path / "b" / "bin" / "llama-server"
    assert places(build_dir=tmp_path / "b2").build.dir == tmp_path / "b2"
    assert places().owned.dir == REPO / "work" / "build"           # what `build` writes: never the env's
    with pytest.raises(WorkTreeError, match="no patched llama.cpp tree"):
        project.Build(tmp_path / "none", tmp_path / "b").require_tree()


def test_explicit_places_need_no_checkout(no_place_env, tmp_path):
    no_place_env.chdir(tmp_path)
    p = project.Places().with_flags(tree=tmp_path / "t", build_dir=tmp_path / "b")
    assert (p.tree, p.build_dir) == (tmp_path / "t", tmp_path / "b")
    with pytest.raises(project.ProjectError):
        p.work_dir


def test_work_dir_subfolders_are_named_in_project_only():
    """A folder of the work dir is a Places property (project.py): `work_dir / "..."` spelled
    anywhere else is a second decision about where something lives."""
    import re
    pattern = re.compile(r'work_dir\s*/\s*["\']')
    offenders = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "src" / "llamacpp_mla_port").rglob("*.py")
                 if p.name != "project.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == [], offenders
    # the control: the pattern sees the spelling it forbids
    assert pattern.search('evidence = ws.work_dir / "evidence"')

"""The verbs' flags (commands/common.py): a flag of two or more verbs is declared once there, so
one spelling has one meaning in every verb (`--target` a GGUF file, `--cmake-target` a CMake
target); a renamed flag still reads its old spelling, hidden from --help; the proof's settings
are one declaration that smoke, rebase --prove and pr --smoke-arg all read."""

from __future__ import annotations

import argparse
import importlib
from collections import defaultdict

import pytest

from llamacpp_mla_port.cli import ALIASES, COMMANDS, module_of
from llamacpp_mla_port.commands import common
from llamacpp_mla_port.errors import PortError


def verb_parser(verb: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"llamacpp-mla-port {verb}")
    importlib.import_module(module_of(verb)).configure(parser)
    return parser


def parsers() -> dict[str, argparse.ArgumentParser]:
    return {verb: verb_parser(verb) for verb in COMMANDS if verb not in ALIASES}


def shared_flag_problems(by_verb: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Every spelling shown in two or more verbs' --help that is not one declaration of
    commands/common.py (a verb's own add_argument, or two declarations under one name)."""
    uses = defaultdict(list)
    for verb, parser in by_verb.items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    uses[flag].append((verb, getattr(action, "shared_flag", None)))
    out = []
    for flag, seen in sorted(uses.items()):
        if len({v for v, _ in seen}) > 1 and (len({t for _, t in seen}) > 1 or None in {t for _, t in seen}):
            own = sorted(v for v, t in seen if t is None)
            out.append(f"{flag}: in {', '.join(sorted({v for v, _ in seen}))}"
                       + (f"; declared by the verb itself in {', '.join(own)}" if own else
                          f"; declared as {sorted({t for _, t in seen})}"))
    return out


def test_the_checker_finds_a_flag_two_verbs_declare_each_their_own():
    a, b = argparse.ArgumentParser(), argparse.ArgumentParser()
    common.shared(a, "--jobs")
    common.shared(b, "--jobs", help="its own help is fine")
    assert shared_flag_problems({"a": a, "b": b}) == []
    b.add_argument("--target", help="a CMake target")          # the old two meanings of --target
    common.shared(a, "--target")
    a.add_argument("--stages")
    assert shared_flag_problems({"a": a, "b": b}) == ["--target: in a, b; declared by the verb itself in b"]
    with pytest.raises(TypeError, match="only"):
        common.shared(a, "--threads", type=str)                 # a verb cannot change the meaning


def test_a_flag_of_two_verbs_is_declared_once_in_common():
    by_verb = parsers()
    assert len(by_verb) == len(COMMANDS) - len(ALIASES)
    problems = shared_flag_problems(by_verb)
    assert problems == [], "\n".join(problems)
    # and the shared ones are really shared: the count the review found, or more
    many = {f for f in {f for p in by_verb.values() for a in p._actions if a.help != argparse.SUPPRESS
                        for f in a.option_strings}
            if sum(f in p._option_string_actions and p._option_string_actions[f].help != argparse.SUPPRESS
                   for p in by_verb.values()) > 1}
    assert len(many) >= 22, sorted(many)


def test_target_is_a_gguf_file_in_every_verb_that_shows_it():
    for verb, parser in parsers().items():
        action = parser._option_string_actions.get("--target")
        if action is not None and action.help != argparse.SUPPRESS:
            assert action.shared_flag == "--target" and "GGUF" in action.help, verb
    for verb in ("build", "pr"):
        help_text = verb_parser(verb).format_help()
        assert "--cmake-target" in help_text and "--target" not in help_text.replace("--cmake-target", ""), verb


#: (verb, old spelling, new spelling): the renamed flags read their old spelling the same way
RENAMED = [
    ("build", ["--target", "llama", "--target", "ggml"], ["--cmake-target", "llama", "--cmake-target", "ggml"]),
    ("build", ["--rpc"], []),
    ("pr", ["--target", "llama"], ["--cmake-target", "llama"]),
    ("pr", ["--build-dir", "/tmp/b"], ["--commit-build-dir", "/tmp/b"]),
    ("upstream-bench", ["--layers", "2"], ["--model-layers", "2"]),
    ("upstream-bench", ["--threads", "1,2,4"], ["--bench-threads", "1,2,4"]),
    ("smoke", ["--work", "/tmp/s", "--build", "/tmp/b"], ["--scratch-dir", "/tmp/s", "--build-dir", "/tmp/b"]),
    ("device-check", ["--prompts", "3"], ["--n-prompts", "3"]),
]


#: the old spellings that mean something else in other verbs: each warns once, naming the new one
SECOND_MEANING = {("build", "--target"): "--cmake-target", ("build", "--rpc"): "nothing",
                  ("pr", "--target"): "--cmake-target", ("pr", "--build-dir"): "--commit-build-dir",
                  ("upstream-bench", "--layers"): "--model-layers", ("upstream-bench", "--threads"): "--bench-threads",
                  ("device-check", "--prompts"): "--n-prompts"}


@pytest.mark.parametrize("verb, old, new", RENAMED, ids=[f"{v}-{o[0]}" for v, o, _ in RENAMED])
def test_a_renamed_flag_keeps_its_old_spelling(verb, old, new, capsys):
    parser = verb_parser(verb)
    got = vars(parser.parse_args(old))
    warned = capsys.readouterr().err
    assert got == vars(parser.parse_args(new))
    if old != ["--rpc"]:                            # build's --rpc is the default, on
        assert got != vars(parser.parse_args(["--onto", "x"] if verb == "rebase" else [])), "the flag did nothing"
    assert capsys.readouterr().err == ""
    use = SECOND_MEANING.get((verb, old[0]))
    if use is None:
        assert warned == ""
    else:                                           # once, though given twice (build --target)
        assert warned.count("warning") == 1 and f"{old[0]} is an old spelling here" in warned, warned
        assert f"use {use}" in warned and warned.startswith(f"warning: llamacpp-mla-port {verb}: ")


def test_the_old_spellings_stay_out_of_help():
    assert "--layers" not in verb_parser("upstream-bench").format_help()
    assert "--build-dir" not in verb_parser("pr").format_help()
    help_text = verb_parser("build").format_help()
    assert "--no-rpc" in help_text and "--rpc " not in help_text and "--rpc\n" not in help_text


def test_the_proofs_settings_are_one_declaration_for_smoke_rebase_and_pr():
    def proof_actions(verb, args=()):
        ns = verb_parser(verb).parse_args(list(args))
        return common.proof_settings(ns)

    default = {"quick": False, "server": True, "threads": 2}
    assert proof_actions("smoke") == default
    assert proof_actions("rebase", ["--onto", "x"]) == default
    assert common.parse_proof_args([]) == default
    given = ["--quick", "--no-server", "--threads=4"]
    want = {"quick": True, "server": False, "threads": 4}
    assert proof_actions("smoke", given) == want == proof_actions("rebase", ["--onto", "x", *given])
    assert common.parse_proof_args(given) == want == common.parse_proof_args(["--quick", "--no-server",
                                                                              "--threads", "4"])
    # pr --smoke-arg takes only the proof's settings, and says which
    with pytest.raises(PortError, match=r"--scratch-dir /tmp/x: make pr runs the proof on the work tree") as err:
        common.parse_proof_args(["--quick", "--scratch-dir", "/tmp/x"])
    assert err.value.hint == "pass only --quick, --no-server or --threads=N"
    with pytest.raises(PortError, match="invalid int value"):
        common.parse_proof_args(["--threads=many"])
    # the three verbs' flags are the same actions' spellings
    for verb in ("smoke", "rebase"):
        actions = verb_parser(verb)._option_string_actions
        assert all(actions[f].shared_flag == f for f in common.PROOF_FLAGS), verb

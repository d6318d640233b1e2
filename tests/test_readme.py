"""The README is the maintainer's page: short, and every claim it makes that the code can check
is checked here against its source, read at test time (templates/port.toml, the Makefile and
`make help`, the CLI's verbs and flags, tests/test_layout.py's LAYERS)."""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from llamacpp_mla_port.cli import COMMANDS, module_of

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_LINES = 350

#: `make X ..._ARGS="..."`: the verb those flags go to (see the Makefile)
ARGS_VERB = {"PATCH_ARGS": "patch", "BUILD_ARGS": "build", "BENCH_ARGS": "bench", "CANARY_ARGS": "rebase"}


def _readme() -> str:
    return README.read_text()


def table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip()[1:-1].split("|")])
            return rows
    raise AssertionError(f"README has no table with the header {header!r}")


def _unquote(cell: str) -> str:
    return cell.strip().strip("`").strip()


def patch_ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> '0001-0003, 0005'."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a:04d}" if a == b else f"{a:04d}-{b:04d}" for a, b in runs)


# ------------------------------------------------------------------------------ size, wording
def test_the_readme_stays_short():
    n = len(_readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}): move measured material to docs/"


def test_the_readme_names_no_issue_numbers_or_experiment_dates():
    text = _readme()
    issues = re.findall(r"\bissues?\s*#?\d+", text, re.I)
    assert not issues, f"README names project issues {issues}: say what the change is instead"
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not dates, f"README carries dates {dates}: dated figures go to docs/bench.md"


def test_the_readme_links_resolve():
    text = _readme()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#")[0] for link in links if "://" not in link and not link.startswith("#")]
    assert local, "the README links to no docs"
    missing = sorted({link for link in local if not (REPO / link).exists()})
    assert not missing, f"README links to missing files {missing}"


# ------------------------------------------------------------------------------ the stack table
def expected_stack_rows() -> list[list[str]]:
    """(name, title, based on, patches) per [stacks.NAME] of templates/port.toml, in its order;
    a stack's patches are its commits' numbers in series (folder name) order, as `make patch`
    exports them."""
    templates = REPO / "templates"
    port = tomllib.loads((templates / "port.toml").read_text())
    folders = sorted(p for p in (templates / "series").iterdir() if p.is_dir())
    stack_of = [tomllib.loads((f / "commit.toml").read_text()).get("stack", "") for f in folders]
    rows = []
    for name, stack in port["stacks"].items():
        numbers = [i + 1 for i, s in enumerate(stack_of) if s == name]
        rows.append([name, stack["title"], ", ".join(stack.get("depends", [])) or "-", patch_ranges(numbers)])
    return rows


def test_the_patch_ranges_helper():
    assert patch_ranges([1, 2]) == "0001-0002"
    assert patch_ranges([13]) == "0013"
    assert patch_ranges([1, 2, 3, 5, 7, 8]) == "0001-0003, 0005, 0007-0008"


def test_the_readme_stack_table_is_port_toml():
    expected = expected_stack_rows()
    got = [[_unquote(c) for c in row] for row in table(_readme(), "| stack | title |")]
    want = "\n".join("| " + " | ".join([n, f"`{t}`", d, p]) + " |" for n, t, d, p in expected)
    assert got == expected, ("the README's stack table (Upstreaming) differs from templates/port.toml "
                             "[stacks] and the commits' `stack` keys; it should read:\n" + want)


# ------------------------------------------------------------------------------ make targets
def makefile_rules() -> dict[str, str]:
    """target -> its recipe text, for the Makefile's plain `target: deps` rules."""
    rules: dict[str, str] = {}
    current = None
    for line in (REPO / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z][\w-]*)\s*:(?!=)", line)
        if m:
            current = m.group(1)
            rules[current] = ""
        elif line.startswith("\t") and current:
            rules[current] += line.strip() + "\n"
        elif line.strip() and not line.startswith("#"):
            current = None
    return rules


def phony_targets() -> list[str]:
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    targets: list[str] = []
    for m in re.finditer(r"^\.PHONY\s*:(.*)$", text, re.M):
        targets += m.group(1).split()
    assert targets, "the Makefile declares no .PHONY targets"
    return targets


def make_help_targets() -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("no `make` on this machine")
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    return [m.group(1) for m in re.finditer(r"^make ([a-z][\w-]*)", out.stdout, re.M)]


def readme_make_targets(text: str) -> set[str]:
    """The targets the README names as commands: `make X` in inline code or starting a line."""
    return set(re.findall(r"(?:^|`)make ([a-z][\w-]*)", text, re.M))


def test_every_phony_target_has_a_rule():
    rules = makefile_rules()
    assert [t for t in phony_targets() if t not in rules] == []


def test_make_help_lists_every_target_and_no_other():
    phony = phony_targets()
    listed = make_help_targets()
    assert len(listed) == len(set(listed)), f"`make help` lists a target twice: {listed}"
    # `help` is the listing itself; every other .PHONY target gets one line
    assert sorted(listed) == sorted(t for t in phony if t != "help"), \
        f"`make help` lists {listed}; the Makefile's .PHONY targets are {phony}"


def test_the_readme_names_every_target_and_only_real_ones():
    phony = set(phony_targets())
    named = readme_make_targets(_readme())
    assert sorted(phony - named) == [], "targets the README never names as `make X`"
    assert sorted(named - phony) == [], "README names `make X` for targets the Makefile does not have"


# ------------------------------------------------------------------------------ verbs and flags
def verb_parser(verb: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"llamacpp-mla-port {verb}")
    importlib.import_module(module_of(verb)).configure(parser)
    return parser


def test_the_readme_verb_table_is_the_cli():
    rows = table(_readme(), "| verb | make target |")
    verbs = [_unquote(r[0]) for r in rows]
    assert verbs == list(COMMANDS), f"README's verb table {verbs} is not the CLI's COMMANDS {list(COMMANDS)}"
    rules = makefile_rules()
    for row in rows:
        verb, target = _unquote(row[0]), _unquote(row[1])
        if not target:
            continue
        name = target.removeprefix("make ").strip()
        assert name in rules, f"README: `{verb}` runs `{target}`, which the Makefile does not have"
        assert f"$(TOOL) {verb}" in rules[name] or (verb == "rebase" and "$(TOOL) rebase" in rules[name]), \
            f"README: `{target}` should run `llamacpp-mla-port {verb}`; its recipe is {rules[name]!r}"


def _code_spans(text: str) -> list[str]:
    """Lines of fenced blocks (a trailing backslash joins the next) and inline code spans."""
    spans: list[str] = []
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    for block in fenced:
        spans += block.replace("\\\n", " ").splitlines()
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    spans += [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", rest)]
    return spans


def readme_flag_uses(text: str) -> list[tuple[str, str, str]]:
    """(verb, flag, where) for every flag the README passes to a verb of this tool."""
    uses = []
    for span in _code_spans(text):
        code = span.split("#")[0]
        for m in re.finditer(r"llamacpp-mla-port ([a-z][\w-]*)(.*)", code):
            if m.group(1) in COMMANDS:
                uses += [(m.group(1), f, span) for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", m.group(2))]
        for var, value in re.findall(r"\b([A-Z]+_ARGS)=\"([^\"]*)\"", code):
            if var in ARGS_VERB:
                uses += [(ARGS_VERB[var], f, span) for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", value)]
    return uses


def test_the_flag_scanner_reads_commands_and_make_args():
    text = ("```sh\nllamacpp-mla-port doctor x.gguf --json   # --not-this\n"
            "make patch PATCH_ARGS=\"--source sdist\"\n```\n"
            "and `llamacpp-mla-port rebase\n  --onto X` in text\n")
    assert sorted((v, f) for v, f, _ in readme_flag_uses(text)) == [
        ("doctor", "--json"), ("patch", "--source"), ("rebase", "--onto")]


def test_every_flag_the_readme_passes_to_a_verb_exists():
    uses = readme_flag_uses(_readme())
    assert uses, "the flag scanner found no flags in the README"
    known = {verb: set(verb_parser(verb)._option_string_actions) for verb in {v for v, _, _ in uses}}
    wrong = sorted({f"{verb} {flag}   (in: {where.strip()})" for verb, flag, where in uses
                    if flag not in known[verb]})
    assert not wrong, "README passes flags the verbs do not take:\n" + "\n".join(wrong)


# ------------------------------------------------------------------------------ the layer table
def test_the_readme_layer_table_is_test_layouts_layers():
    from tests.test_layout import LAYERS

    rows = table(_readme(), "| layer | what |")
    got = [tuple(_unquote(c).removesuffix(".py").rstrip("/") for c in row[0].split(",")) for row in rows]
    assert got == [tuple(layer) for layer in LAYERS], \
        f"README's layout table {got} differs from tests/test_layout.py LAYERS {LAYERS}"


# ------------------------------------------------------------------------------ the docs it points to
def test_the_parity_table_lives_in_docs_bounds_only():
    header = "| mode | checked | bound |"
    assert header not in _readme(), "the parity threshold table belongs to docs/bounds.md, not the README"
    assert header in (REPO / "docs" / "bounds.md").read_text()


# ------------------------------------------------------------------------------ templates/README.md
def tree_entries(text: str) -> set[str]:
    """The top-level names of the first fenced `templates/` tree: its entries two spaces in."""
    block = re.search(r"^```\ntemplates/\n(.*?)^```", text, re.M | re.S)
    assert block, "templates/README.md has no ```templates/ tree"
    return {m.group(1).rstrip("/") for m in re.finditer(r"^  (\S+)", block.group(1), re.M)}


def test_the_templates_tree_names_what_templates_holds():
    text = (REPO / "templates" / "README.md").read_text()
    assert tree_entries(text) == {p.name for p in (REPO / "templates").iterdir()}, \
        "templates/README.md's tree differs from the folder: add (or drop) the entry"
    assert tree_entries("```\ntemplates/\n  a.toml   x\n  b/\n    c.md  y\n```\n") == {"a.toml", "b"}
    assert "(../patches/README.md)" in text and (REPO / "patches" / "README.md").is_file()

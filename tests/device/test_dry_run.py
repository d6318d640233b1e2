"""The device check's new stages run on this CPU (the dry run, CUDA off, quick: one parity shape
and case per mode, the reduced real-size pair, one thread count), through the driver's own stage
loop (check.drive) over a run context on the work tree and build, and the judge fed their real
figures. What differs from `make device-check DRY_RUN=1` (which builds the pruned tree and the
CPU variants cold, minutes): the tree and build are the tests', and every CPU variant's
llama-bench is the work build's (its base is then the patched tree: the reproducer can only
show that both sides load and generate, and on an AMX CPU it must say it did not reproduce).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from llamacpp_mla_port import project
from llamacpp_mla_port.bench.floors import block_work
from llamacpp_mla_port.build import ensure_build
from llamacpp_mla_port.device import bundle, check, judge, profile
from llamacpp_mla_port.device.context import CheckRun
from llamacpp_mla_port.device.crossparity import CONTROLS, figure
from llamacpp_mla_port.device.variants import VARIANT_STACKS, bins_dir, prepare_variants
from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.proof.parity import MODES, PARITY_CONFIGS, make_draft
from llamacpp_mla_port.proof.reference.model import read_target_head
from llamacpp_mla_port.proof.run.draft_logits import load_outputs
from llamacpp_mla_port.stages import Stages

pytestmark = [pytest.mark.build, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STAGES = ("parity", "realsize", "host", "threads")


@pytest.fixture(scope="module")
def dry(patched_tree, llama_build, tmp_path_factory) -> CheckRun:
    root = tmp_path_factory.mktemp("device-dry")
    work = root / "work"
    work.mkdir()
    project.tree_in(work).symlink_to(Path(patched_tree).resolve())
    project.build_in(work).symlink_to(Path(llama_build).resolve())
    fixtures = work / "fixtures"
    target = write_kimi_k3_target(llama_build, fixtures / "kimi-k3-target.gguf")
    embd, _ = read_target_head(target)
    for weights in sorted({m.weights for m in MODES}):
        make_draft(patched_tree, fixtures / "parity", PARITY_CONFIGS[0], embd.shape[1], embd.shape[0], weights)
    bundle_dir = root / "bundle"
    prepare_variants(patched_tree, REPO / "templates", REPO / "patches", bundle_dir / "variants", bundle.keep_in_tree)
    bench = project.program(ensure_build(patched_tree, llama_build, ("llama-bench",), echo=False), "llama-bench")
    for name in ("base", *VARIANT_STACKS):
        d = bins_dir(work, name)
        d.mkdir(parents=True)
        (d / "llama-bench").symlink_to(bench)
        (d / "done.json").write_text(json.dumps({"note": "make test: the work build stands for every variant"}))
    run = CheckRun(bundle_dir, root / "out", work, True, STAGES, 2, check.new_report(True, None, 2, STAGES),
                   lambda m: None, quick=True)
    run.runner = Stages(run.report["stages"], save=run.save)
    check.start_models(run)
    try:
        check.drive(run)
    finally:
        for proc in run.background.values():
            proc.stop(grace=2)
    return run


def test_every_new_stage_ran_and_the_report_was_saved(dry):
    st = dry.report["stages"]
    assert list(st) == list(STAGES)
    for name in ("parity", "realsize", "threads"):
        assert st[name]["ok"] is True, st[name]
    saved = json.loads((dry.out / "report.json").read_text())
    assert list(saved["stages"]) == list(STAGES)
    md = (dry.out / "report.md").read_text()
    assert "Dry run with CUDA off" in md and "exactly 0" in md
    assert "## Parity like with like" in md and "## Parity of the host CPU against float64" in md
    assert "Where the block's time goes" in md and "## The host CPU" in md and "## Thread rows" in md
    assert "Not asked for: " in md and "lossless (answered on 2026-12-04" in md


def test_like_with_like_on_the_same_backend_is_exact_and_every_control_fails(dry):
    like = dry.report["parity"]["like_with_like"]
    assert set(like["modes"]) == {m.name for m in MODES}
    for name, m in like["modes"].items():
        # both sides are the CPU build: bit for bit, deepseek2 and the draft
        assert m["draft"] == 0.0 and m["twin"] == 0.0 and m["bound"] == 0.0 and m["ok"], (name, m)
        assert set(m["controls"]) == set(CONTROLS), (name, m["controls"])
        for c, v in m["controls"].items():
            assert v > 1e-3 and math.isinf(m["separation"][c]) and m["controls_fail"][c], (name, c, v)
        # a control's real figure in the draft's place fails, against this run's deepseek2 figure and a looser one
        worst = max(m["controls"].values())
        assert not judge.judge_like(worst, m["twin"], m["controls"])["ok"]
        assert not judge.judge_like(min(m["controls"].values()), 1e-3, m["controls"])["ok"]
    for name, j in dry.report["parity"]["cpu"]["modes"].items():
        assert j["ok"] and all(j["controls_fail"].values()), (name, j)


def test_a_controls_run_is_measured_as_the_draft_is(dry):
    """figure() of a control's saved run against the right draft's CPU run: the stage's number."""
    case = dry.work / "cross-parity" / "runs" / PARITY_CONFIGS[0].name / "f32" / "case0"
    cpu, wrong = load_outputs(case / "cpu"), load_outputs(case / "mscale_dropped")
    f = figure(wrong, cpu)
    assert f["worst"] == dry.report["parity"]["like_with_like"]["configs"][PARITY_CONFIGS[0].name]["f32"][
        "cases"][0]["controls"]["mscale_dropped"]
    assert figure(cpu, cpu)["worst"] == 0.0 and figure(cpu, cpu)["chain_equal"]


def test_the_block_profile_adds_up(dry):
    rs = dry.report["realsize"]
    prof = rs["profile"]
    assert set(prof["groups"]) == set(profile.GROUPS)
    assert sum(g["nodes"] for g in prof["groups"].values()) == prof["n_nodes"]
    assert prof["groups"]["lm_head"]["nodes"] == 1 and prof["groups"]["markov_head"]["nodes"] > 1
    assert all(prof["groups"][g]["nodes"] > 0 for g in ("ffn", "attention", "other"))
    work = block_work(Path(rs["models"]["draft"]), Path(rs["models"]["target"]), 7, 512)
    assert sum(g["bytes"] for g in prof["groups"].values()) == work.bytes_total
    assert prof["per_node_sync_s"] > 0 and 0 < prof["net_s"] <= prof["profiled_s"]
    assert rs["forms"]["permuted"]["over_floor"] > 0 and rs["v_b_ops"]["permuted"] == ["MUL_MAT"]


def test_host_reports_the_cpu_and_runs_the_reproducer(dry):
    host = dry.report["host"]
    assert host["cpu"]["model"] and (host["cpu"]["lscpu"] or not shutil.which("lscpu"))
    rep = host["repro"]
    assert rep["branch_default"]["outcome"] == "ran" and rep["after"]["outcome"] == "ran"
    assert rep["after_amx"]["outcome"] == "ran" or host["cpu"]["amx"]     # AMX: the tile bug may crash it
    assert any("repack 0" in k for k in rep["before_ts"])
    # the branch's own run has its rows, or its crash is named in the verdict
    amx_ran = rep["after_amx"]["outcome"] == "ran"
    assert any("repack 1" in k for k in rep["after_ts"]) is amx_ran
    assert amx_ran or f"--repack 1 benchmark {rep['after_amx']['outcome']}" in rep["verdict"]
    # here the base is the patched build: where the CPU has AMX the stage must say it did not reproduce
    assert rep["ok"] is (not host["cpu"]["amx"]) and dry.report["stages"]["host"]["ok"] is rep["ok"]


def test_thread_rows_label_both_sides(dry):
    t = dry.report["thread_rows"]
    assert t["groups"] and not t["dropped"]
    rows = [json.loads(ln) for ln in (dry.out / "thread-rows.jsonl").read_text().splitlines()]
    sides = {r["build_commit"] for r in rows}
    assert sides == {"base", "cpu-q0-odd-columns", "cpu-fa-kv-head-tiles"}
    for g in t["groups"]:
        assert [r["side"] for r in g["runs"]] == ["base", g["stack"], g["stack"], "base"]
        assert g["ratios"] and all(v > 0 for v in g["ratios"].values())
        # rows moved to --repack 0 only after a default run died of a signal, and say so
        if "note" in g:
            assert ("crashed" in g["note"] or "aborted" in g["note"]) and g["args"][g["args"].index("--repack") + 1] == "0", g
            assert dry.report["host"]["cpu"]["amx"], g      # the tile path's crash needs AMX
    assert {g["args"][-1] for g in t["groups"] if g["stack"] == "cpu-fa-kv-head-tiles"} == {"0", "256"}


def test_prepared_variants_turn_the_tree_into_the_base_and_back(dry, tmp_path):
    """device.variants on a copy of the files the series changes: the base, a stack, the base again."""
    from llamacpp_mla_port.device.variants import set_variant

    variants = dry.bundle / "variants"
    manifest = json.loads((variants / "variants.json").read_text())
    tree = tmp_path / "tree"
    for rel in manifest["base"]["files"]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dry.tree / rel, tree / rel)
    written = set_variant(tree, variants, manifest, "base", None)
    assert written and all((tree / r).read_bytes() == (variants / "base" / r).read_bytes() for r in written)
    probe = manifest["stacks"]["loader-probe"]["files"]
    assert set_variant(tree, variants, manifest, "loader-probe", "base") == probe
    assert (tree / probe[0]).read_bytes() == (dry.tree / probe[0]).read_bytes()    # the series has the stack
    assert set_variant(tree, variants, manifest, "base", "loader-probe") == probe
    assert set_variant(tree, variants, manifest, "base", "base") == []


def test_each_control_draft_holds_its_one_mistake(dry, tmp_path):
    """The controls' GGUFs (crossparity.write_control) against the right draft, tensor by tensor."""
    import numpy as np

    from llamacpp_mla_port.device.crossparity import write_control
    from llamacpp_mla_port.fixtures.draft_gguf import write_mla_draft_gguf
    from llamacpp_mla_port.proof.differential import Draft

    draft = dry.fixtures / "parity" / f"{PARITY_CONFIGS[0].name}-float32" / "draft.gguf"
    lora = PARITY_CONFIGS[0].overrides["kv_lora_rank"]
    right = {n: d for n, d, _ in Draft.read(draft).tensors}
    kvs = {k: v for k, v, *_ in Draft.read(draft).kvs}
    control = write_control(draft, "latent_rope_swapped", tmp_path / "a.gguf", lora)
    swapped = {n: d for n, d, _ in Draft.read(control).tensors}
    kv = "blk.0.attn_kv_a_mqa.weight"
    assert np.array_equal(swapped[kv][:-lora], right[kv][lora:])
    assert np.array_equal(swapped[kv][-lora:], right[kv][:lora])
    assert all(np.array_equal(swapped[n], right[n]) for n in right if not n.endswith("attn_kv_a_mqa.weight"))
    kb = {n: d for n, d, _ in Draft.read(write_control(draft, "k_b_v_b_swapped", tmp_path / "b.gguf", lora)).tensors}
    assert np.array_equal(kb["blk.1.attn_k_b.weight"], right["blk.1.attn_v_b.weight"].transpose(0, 2, 1))
    assert np.array_equal(kb["blk.1.attn_v_b.weight"], right["blk.1.attn_k_b.weight"].transpose(0, 2, 1))
    ms = {k: v for k, v, *_ in Draft.read(write_control(draft, "mscale_dropped", tmp_path / "c.gguf", lora)).kvs}
    assert kvs["dflash.rope.scaling.yarn_log_multiplier"] > 0 and ms["dflash.rope.scaling.yarn_log_multiplier"] == 0
    # where K's and V's head sizes differ the swap has no meaning: no control, not a wrong one
    other = write_mla_draft_gguf(tmp_path / "nope16-v12.gguf", dry.fixtures / "kimi-k3-target.gguf",
                                 config={"qk_nope_head_dim": 16, "v_head_dim": 12})
    assert write_control(other, "k_b_v_b_swapped", tmp_path / "d.gguf", 64) is None

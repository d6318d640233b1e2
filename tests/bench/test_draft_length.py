"""What the draft buys: the table's arithmetic, the published curves, the scaling fit, the
Kimi-K3-shaped target (llama.cpp loads it and routes its 896 experts), verify-bench, and the
`draft-length` verb on the tiny pair (its numbers are not judged: only that it measures and
reports, and refuses what it cannot measure)."""

from __future__ import annotations

import json
import math

import pytest

from llamacpp_mla_port.bench import acceptance as acc
from llamacpp_mla_port.bench import k3_scale, speedup
from llamacpp_mla_port.bench.verify import expert_bounds


def _costs(verify_ms: dict[int, float], block_ms: float = 10.0, t1_ms: float = 100.0) -> speedup.StepCosts:
    return speedup.StepCosts(t1_ms / 1000, {n: v / 1000 for n, v in verify_ms.items()}, {},
                             {k: block_ms / 1000 for k in range(1, 8)}, {1: 0.001, 8: 0.008})


def test_speedup_is_tokens_per_step_times_t1_over_the_step():
    # a target whose verify costs T(1) whatever N: every accepted token is profit
    flat = _costs({n: 100.0 for n in range(1, 9)})
    curve = acc.Curve("half", "test", tuple(0.5 ** i for i in range(1, 8)))
    tab = speedup.table(flat, [curve])
    r3 = tab["rows"][2]
    e3 = 1 + 0.5 + 0.25 + 0.125
    step = 0.010 + (0.001 + 0.001 * (e3 - 1)) + 0.100      # block + injection of E rows + verify
    assert r3["k"] == 3 and math.isclose(r3["tokens_per_step"]["half"], e3)
    assert math.isclose(r3["speedup"]["half"], e3 * 0.100 / step, rel_tol=1e-9)
    # break-even: the tokens a step must yield (with k + 1 rows injected), and the one rate giving them
    need = (0.010 + 0.004 + 0.100) / 0.100
    assert math.isclose(r3["break_even_tokens"], need)
    a = r3["break_even_rate"]
    assert math.isclose(1 + a + a * a + a ** 3, need, rel_tol=1e-6)
    assert tab["best"]["half"]["pays"] and tab["best"]["half"]["k"] == 7    # flat verify: longest wins


def test_a_verify_that_grows_with_n_makes_the_draft_not_pay():
    # the control: each drafted token costs the target a full T(1) more (an MoE reading new experts)
    steep = _costs({n: 100.0 * n for n in range(1, 9)})
    curve = acc.Curve("good", "test", (0.9,) * 7)
    tab = speedup.table(steep, [curve])
    assert not tab["best"]["good"]["pays"] and tab["best"]["good"]["k"] == 0
    assert all(r["break_even_rate"] is None for r in tab["rows"])           # never, even all accepted
    assert speedup.recommended(tab) == ("good", 0)
    text = "\n".join(speedup.render(tab))
    assert "does not pay here" in text and "never (even all accepted)" in text


def test_published_curves_give_their_sources_means():
    means = {c.name: c.tokens_per_step(7) - 1 for c in acc.PUBLISHED}
    assert math.isclose(means["ATOM"], 3.8, abs_tol=0.02)
    assert math.isclose(means["vLLM production"], 0.42 * 7, abs_tol=1e-3)
    assert math.isclose(means["tokenspeed"], 1.6, abs_tol=1e-3)
    assert math.isclose(means["SGLang"], 0.6, abs_tol=1e-3)
    # InferenceX's per-length figures hold at every length it published
    inferencex = next(c for c in acc.PUBLISHED if c.name == "InferenceX")
    assert all(math.isclose(inferencex.tokens_per_step(k), t, abs_tol=1e-9) for k, t in acc.INFERENCEX_TOKENS.items())
    for c in acc.PUBLISHED:
        assert len(c.cum) == 7 and c.source and all(0 <= x <= 1 for x in c.cum)
        assert list(c.cum) == sorted(c.cum, reverse=True), c.name        # cumulative: never rises
    with pytest.raises(ValueError):
        acc.geometric_rate(7.5)


def test_expert_bounds():
    assert expert_bounds(896, 16, 1) == (16.0, pytest.approx(16.0))
    ident, indep = expert_bounds(896, 16, 8)
    assert ident == 16.0 and indep == pytest.approx(896 * (1 - (880 / 896) ** 8)) and 16 * 8 > indep > 110


def test_the_fit_recovers_per_layer_costs_and_scales_to_93_layers():
    from llamacpp_mla_port.fixtures.k3_shaped import K3_SHAPE, routed_expert_bytes

    F, aK, aM = 0.2, 0.05, 0.03
    per_file = {name: {1: F + layers.count("K") * aK + layers.count("M") * aM}
                for name, layers in k3_scale.FILES.items()}
    terms = k3_scale.fit(per_file)
    got = terms[1]
    assert got["F"] == pytest.approx(F) and got["a_K"] == pytest.approx(aK) and got["a_M"] == pytest.approx(aM)
    # the routed experts' missing width, by its bytes at the measured read rate
    rate = 20e9
    scaled = k3_scale.scale(terms, {1: 16.0}, rate)[1]
    extra = routed_expert_bytes(K3_SHAPE) - routed_expert_bytes(K3_SHAPE, k3_scale.N_FF_EXP)
    assert scaled["routed_experts"] == pytest.approx(92 * 16 * extra / rate)
    assert scaled["total"] == pytest.approx(F + 68 * aK + 24 * aM + 92 * 16 * extra / rate)
    # a step's bytes: everything but the unrouted experts (16 of 896 read in each MoE layer)
    assert k3_scale.step_bytes("DKM", 896) - k3_scale.step_bytes("DKM", 16) == pytest.approx(
        2 * 880 * routed_expert_bytes(K3_SHAPE, k3_scale.N_FF_EXP))
    # the control: a file measured 10 % slow moves the fit
    per_file["F3"][1] *= 1.1
    assert k3_scale.fit(per_file)[1]["a_M"] != pytest.approx(aM)


# ------------------------------------------------------------------------------- with the build

@pytest.fixture(scope="module")
def k3_test_target(tmp_path_factory):
    from llamacpp_mla_port.fixtures.k3_shaped import K3_TEST_SHAPE, write_k3_shaped_target
    return write_k3_shaped_target(tmp_path_factory.mktemp("k3") / "k3.gguf", "DKM", 32, K3_TEST_SHAPE)


@pytest.mark.build
def test_the_k3_shaped_target_loads_and_routes_896_experts(patched_tree, llama_build, k3_test_target, tmp_path):
    from gguf import GGUFReader

    from llamacpp_mla_port.bench.verify import run_verify_bench, summarize
    from llamacpp_mla_port.proof.run.programs import compile_program

    tensors = {t.name: t for t in GGUFReader(str(k3_test_target)).tensors}
    up = tensors["blk.1.ffn_up_exps.weight"]
    assert up.tensor_type.name == "MXFP4" and [int(x) for x in up.shape] == [128, 32, 896]     # ggml order
    assert tensors["blk.2.attn_q_b.weight"].tensor_type.name == "Q8_0"
    exe = compile_program("verify-bench", patched_tree, llama_build)
    res, _ = run_verify_bench(exe, k3_test_target, tmp_path / "v.json", threads=1, depth=24, rounds=1,
                              n_values=(1, 2, 8), expert_blocks=3, timeout=300)
    assert res["arch"] == "kimi-k3" and res["recurrent"] and res["rs_seq_effective"] == 7
    # extra buffer types off only where the default run died of a signal, and then said so
    assert res["extra_bufts"] == (res["note"] is None), res["note"]
    assert all(len(res[k][n]) == 1 and res[k][n][0] > 0 for k in ("alone_seconds", "spec_seconds")
               for n in ("1", "2", "8"))
    ex = summarize([res]).experts
    assert (ex["n_expert"], ex["n_expert_used"], ex["moe_layers"]) == (896, 16, 2)
    rows = ex["per_n"]
    assert rows[1]["distinct_min"] == rows[1]["distinct_max"] == 16          # top-16 of 896, one token
    assert 16 < rows[8]["distinct_mean"] <= 128 and rows[8]["same_token_mean"] <= rows[8]["distinct_mean"]
    # the control: a rollback window shorter than the block is refused before anything runs
    bad = tmp_path / "bad.json"
    with pytest.raises(Exception, match="rs-seq 2 cannot roll back a block of 8"):
        run_verify_bench(exe, k3_test_target, bad, threads=1, depth=8, rounds=1, n_values=(1, 8),
                         expert_blocks=0, extra=("--rs-seq", 2), timeout=60)


@pytest.fixture(scope="module")
def tiny_pair(patched_tree, llama_build, tmp_path_factory):
    from llamacpp_mla_port.bench.spec import tiny_spec_pair
    d = tmp_path_factory.mktemp("tiny-pair")
    target, draft, prompts = tiny_spec_pair(patched_tree, llama_build, d, n_prompts=2, n_predict=24)
    (d / "prompts.txt").write_text("\n".join(prompts) + "\n")
    return target, draft, d / "prompts.txt", d


def _verb(patched_tree, llama_build, *argv):
    from llamacpp_mla_port.cli import main
    return main(["draft-length", "--tree", str(patched_tree), "--build-dir", str(llama_build), *map(str, argv)])


@pytest.mark.build
def test_draft_length_measures_and_reports_on_the_tiny_pair(patched_tree, llama_build, tiny_pair, tmp_path, capsys):
    target, draft, prompts, _ = tiny_pair
    out = tmp_path / "dl"
    rc = _verb(patched_tree, llama_build, "--target", target, "--draft", draft, "--prompts", prompts, "--out", out,
               "--threads", 1, "--depth", 16, "--rounds", 1, "--repeats", 1, "--min-seconds", 0, "--n-predict", 16)
    printed = capsys.readouterr().out
    assert rc == 0, printed
    rep = json.loads((out / "report.json").read_text())
    assert sorted(map(int, rep["verify_cost"]["spec_s"])) == list(range(1, 9))
    assert sorted(map(int, rep["draft_block_s"])) == list(range(1, 8))
    assert all(v > 0 for v in rep["draft_block_s"].values()) and set(rep["draft_inject_s"]) == {"1", "8"}
    assert rep["acceptance"]["steps"] > 0 and len(rep["acceptance"]["per_position"]) == 7
    assert rep["verify_cost"]["experts"]["tokens"] == "text"       # the prompts fill the cache: real routing
    assert [r["k"] for r in rep["table"]["rows"]] == list(range(1, 8))
    assert rep["table"]["curves"][0]["measured"] and len(rep["table"]["curves"]) == 1 + len(acc.PUBLISHED)
    assert "| N | T(N) spec (ms)" in printed and "break-even" in printed
    assert "use --spec-draft-n-max" in printed or "does not pay" in printed
    assert "or --spec-draft-auto --spec-draft-n-max 7" in printed and "| deltafin T(N)/T(1) |" in printed
    m = rep["acceptance"]
    assert f"{1 + m['accepted'] / m['steps']:.2f} tokens per step" in printed and f"{m['steps']} verify steps" in printed
    assert (out / "report.md").is_file() and (out / "plots" / "draft_length.png").stat().st_size > 1000


@pytest.mark.build
def test_draft_length_refuses_what_it_cannot_measure(patched_tree, llama_build, tiny_pair, tmp_path, capsys):
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target

    target, draft, _, d = tiny_pair
    rc = _verb(patched_tree, llama_build, "--target", target, "--draft", tmp_path / "none.gguf")
    err = capsys.readouterr().err
    assert rc != 0 and "none.gguf: no such file" in err
    # llama.cpp's own 2-layer test model: the draft taps layers 1, 3 and 5
    two = write_kimi_k3_target(llama_build, d / "kimi-k3-tiny.gguf")
    rc = _verb(patched_tree, llama_build, "--target", two, "--draft", draft, "--out", tmp_path / "x")
    err = capsys.readouterr().err
    assert rc != 0 and "does not pair" in err and "are outside the target's layer inputs" in err, err
    assert not (tmp_path / "x" / "report.json").exists()
    rc = _verb(patched_tree, llama_build, "--target", target, "--draft", draft, "--prompts", tmp_path / "p.txt")
    assert rc != 0 and "--prompts" in capsys.readouterr().err


def test_the_pair_check_refuses_only_taps_outside_the_target_in_the_doctors_words(tmp_path):
    """Tap 0 (the input of layer 0: the token embeddings) is a layer of a 2-layer target, as the doctor and
    llama.cpp take it; tap 3 is none, and the refusal is the doctor's target_layers finding."""
    from llamacpp_mla_port.bench.draft_length import check_pair
    from llamacpp_mla_port.errors import PortError
    from tests.helpers.doctor_gguf import write_mla_draft, write_target

    target = write_target(tmp_path / "t.gguf", n_layer=2)
    check_pair(target, write_mla_draft(tmp_path / "d01.gguf", target_layers=[0, 1], n_taps=2))
    with pytest.raises(PortError, match="does not pair") as err:
        check_pair(target, write_mla_draft(tmp_path / "d13.gguf", target_layers=[1, 3], n_taps=2))
    assert "target_layers: dflash.target_layers [1, 3] is wrong" in err.value.message
    assert "ids [3] are outside the target's layer inputs 1..1 (target has 2 layers)" in err.value.message
    assert "tapped layers are not" not in err.value.message


@pytest.mark.build
def test_the_fixtures_verbs_mla_pair_pairs(llama_build, tmp_path, capsys):
    """The fixtures verb's draft taps layers 0 and 1 of its 2-layer target: doctor loads it, so draft-length
    takes it."""
    from llamacpp_mla_port.bench.draft_length import check_pair
    from llamacpp_mla_port.cli import main
    from llamacpp_mla_port.gguf.header import read_header

    assert main(["fixtures", str(tmp_path), "--what", "mla-draft", "--build-dir", str(llama_build)]) == 0
    target, draft = tmp_path / "kimi-k3-target.gguf", tmp_path / "mla-draft.gguf"
    assert read_header(draft).get("dflash.target_layers") == [0, 1]
    assert read_header(target).get("kimi-k3.block_count") == 2
    check_pair(target, draft)
    capsys.readouterr()
    assert main(["doctor", str(draft), "--target", str(target)]) in (0, 1)      # loads (a warning: tap 0)
    assert "target_taps        taps [0, 1] exist in the 2-layer target" in capsys.readouterr().out


def test_the_verbs_help_says_what_it_measures_and_what_it_assumes(capsys):
    from llamacpp_mla_port.cli import main
    with pytest.raises(SystemExit) as done:
        main(["draft-length", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "What it measures" in text and "What it assumes" in text
    for term in ("T(N)", "T_draft(k)", "acceptance", "experts", "greedy decoding, one sequence",
                 "speedup(k) = E[tokens per step](k) x T(1) / (T_draft(k) + T(k+1) + rollback)", "break-even"):
        assert term in text, term

"""`make test` runs the whole proof: `llamacpp-mla-port smoke --quick` on the patched build.

The JSON report is read back and every claim in it is checked here as well, so a smoke
that printed `ok` over a weak run (too few prompts, no acceptance, a mode missing) fails.
--quick keeps every stage and the whole parity matrix; of the lossless matrix (draft lengths
1/3/7 x flash attention x p_min, bigram draft, each by llama-speculative-simple and by
llama-server) it runs lengths 1, 3 and 7 and each (flash attention, p_min) pair once, and the
random draft at length 7: 5 runs of each program, not 14. The 9 it leaves out (bigram k=1 but
flash attention off with p_min 0, k=3 but both on, k=7 with both off or both on; random k=3)
run in `make smoke` and in `make test-slow` (test_the_full_smoke_runs_every_lossless_combination).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def report(smoke_run):
    """`llamacpp-mla-port smoke --no-build` on the patched build (tests/conftest.py: once per session)."""
    return smoke_run.report


def test_smoke_passes_every_stage(report):
    assert report["ok"] is True
    assert set(report["stages"]) >= {"parity", "oracle", "target", "lossless"}
    assert all(stage["ok"] for stage in report["stages"].values()), report["stages"]


def test_parity_covers_three_shapes_and_five_modes(report):
    parity = report["parity"]
    assert len(parity) >= 3
    for name, cfg in parity.items():
        assert set(cfg["modes"]) == {"f32", "f16-cache", "flash-attn", "bf16", "q8_0-cache"}, name
        for mode, res in cfg["modes"].items():
            if "skipped" in res:
                assert mode == "q8_0-cache", (name, mode, res)      # llama.cpp refuses that shape's blocks
                continue
            assert res["pass"], (name, mode, res)
            assert res["worst_nmse"] <= res["threshold"], (name, mode, res)
            # the gross controls (causal block, no YaRN, NeoX rotation) land >= 100x above the bound
            assert res["gross_control_margin"] >= 100, (name, mode, res["controls"])
        assert sum("skipped" not in r for r in cfg["modes"].values()) >= 4, name
        # lower precisions may flip a near-tie argmax (parity allows it only where the
        # reference's own top-2 margin is within the precision); F32 must not
        assert cfg["modes"]["f32"]["chains_equal"], (name, cfg["modes"]["f32"])
        assert cfg["modes"]["f32"]["kq_scale_1pct_caught"], name
        # K-only MLA cache: F16 bytes per token are half the F32 ones
        assert cfg["draft_kv_bytes_per_token_f16"] * 2 == cfg["draft_kv_bytes_per_token_f32"]


def test_parity_reports_each_mode_s_headroom_on_this_machine(report):
    table = report["parity_modes"]
    assert "CPU" in table["system_info"]            # llama_print_system_info of the build that ran
    assert set(table["modes"]) == {"f32", "f16-cache", "flash-attn", "bf16", "q8_0-cache"}
    for mode, row in table["modes"].items():
        # headroom = bound / the worst figure measured here (None: matched exactly); > 1 is the bound holding
        if row["worst_nmse"] == 0:
            assert row["headroom"] is None, (mode, row)
        else:
            assert row["headroom"] == pytest.approx(row["threshold"] / row["worst_nmse"], rel=1e-12), mode
            assert row["headroom"] > 1, (mode, row)
        assert row["gross_control_margin"] >= 100, (mode, row)
        assert row["pass"], (mode, row)
    assert table["modes"]["f32"]["threshold"] <= 1e-9
    assert table["modes"]["f32"]["kq_scale_1pct_caught"]


def test_target_side_is_the_prefix_stream(report):
    for name, res in report["target_side"].items():
        assert res["worst_nmse_vs_prefix_stream"] < 1e-9, name
        assert res["max_nmse_vs_plain_residual"] > 1e-3, name


def _lossless_runs(lossless: dict) -> set[tuple[str, str, int, bool, bool]]:
    """Every run checked: each output equal to the target alone, the bigram draft partly
    accepted; (program, draft, draft length, flash attention, p_min on) of each."""
    assert lossless["n_prompts"] >= 20 and lossless["n_mismatches"] == 0
    runs = lossless["speculative_simple"] + lossless["server"]
    assert all(r["identical"] == r["of"] == lossless["n_prompts"] for r in runs)
    assert lossless["server"] and all(r["parallel"] == 2 for r in lossless["server"])
    for r in runs:
        if r["draft"] == "bigram":
            # partial acceptance: some drafts accepted, some rejected (rollback exercised)
            assert 0 < r["accepted"] < r["drafted"], r
    return {("server" if "parallel" in r else "simple", r["draft"], r["draft_max"], r["flash_attn"], r["p_min"] > 0)
            for r in runs}


def test_speculative_decoding_is_lossless_with_partial_acceptance(report):
    """--quick: every draft length and every (flash attention, p_min) pair, by both programs."""
    seen = _lossless_runs(report["lossless"])
    for program in ("simple", "server"):
        bigram = {(k, fa, conf) for prog, draft, k, fa, conf in seen if prog == program and draft == "bigram"}
        assert {k for k, _, _ in bigram} == {1, 3, 7}, (program, bigram)
        assert {(fa, conf) for _, fa, conf in bigram} == {(fa, conf) for fa in (False, True)
                                                          for conf in (False, True)}, (program, bigram)
        assert any(prog == program and draft == "random" for prog, draft, *_ in seen), program
    # --spec-draft-auto (spec-auto-length): lossless in both programs (above), and with the draft
    # the target does not accept it drafts fewer tokens than the static length (measured: 10 % in
    # llama-speculative-simple, 27 % in llama-server; tests/proof/test_pairing.py -k auto_stops holds more)
    for rows in (report["lossless"]["speculative_simple"], report["lossless"]["server"]):
        by = {(r["draft"], r["draft_max"]): r for r in rows}
        assert {("bigram-auto", 7), ("random-auto", 7)} <= set(by), sorted(by)
        assert by["random-auto", 7]["drafted"] < by["random", 7]["drafted"], (by["random-auto", 7], by["random", 7])
    # the chains the real loops drafted follow the Markov head (fed the previous token, not MASK)
    chain = report["lossless"]["chain"]
    assert chain["checked"] >= 100 and chain["n_breaks"] == 0, chain


@pytest.mark.slow
def test_the_full_smoke_runs_every_lossless_combination(full_smoke_run):
    report = full_smoke_run.report
    assert report["ok"] is True, report["stages"]
    seen = _lossless_runs(report["lossless"])
    want = {(prog, "bigram", k, fa, conf) for prog in ("simple", "server") for k in (1, 3, 7)
            for fa in (False, True) for conf in (False, True)}
    want |= {(prog, "random", k, False, False) for prog in ("simple", "server") for k in (3, 7)}
    assert seen == want


@pytest.mark.slow
def test_every_loop_drafts_the_same_chains_at_every_batch_size(smoke_run, patched_tree, llama_build, tmp_path):
    """The bigram draft (length 7) on one prompt it learned: llama-speculative-simple at -ub/-b 9 (the
    smallest a block of 8 allows), 64, 512 and 9/512, llama-server with 1 slot at -ub 9 and 512 and 4
    slots (4 equal requests in flight) at -ub 32 (four blocks of 8 in one ubatch; less is refused) and
    512. Every chain any loop drafted follows the Markov table; step by step every run of a program and
    every slot drafted the same chains (a last step may be cut short by -n) and accepted as many. The
    server drafts first one token later than llama-speculative-simple, so their steps differ."""
    from llamacpp_mla_port.proof import lossless

    work = smoke_run.work / "lossless"
    pair = lossless.prepare_pair(patched_tree, llama_build, work, smoke_run.work / "kimi-k3-target.gguf")
    prompt, draft = pair.prompts[0], pair.drafts["bigram"]
    logs: dict[str, dict[str, str]] = {"simple": {}, "server": {}}
    accepted: dict[str, set[int]] = {"simple": set(), "server": set()}
    for ub, b in ((9, 9), (64, 64), (512, 512), (9, 512)):
        run = lossless.speculative_simple(llama_build, pair.target, draft, prompt, 7, True, 0.0,
                                          extra=("-ub", ub, "-b", b, "-lv", "5"))
        assert lossless.same_greedy_output(run.text, pair.alone[prompt][0]), (ub, b, run.text)
        logs["simple"][f"-ub {ub} -b {b}"] = run.log
        accepted["simple"].add(run.n_accepted)
    for n_par, ub, b in ((1, 9, 9), (1, 512, 512), (4, 32, 32), (4, 512, 512)):
        path = tmp_path / f"server-{n_par}-{ub}.log"
        with lossless.Server(llama_build, pair.target, draft, 7, True, 0.0, path, parallel=n_par,
                             extra=["-ub", str(ub), "-b", str(b), "-lv", "5"]) as srv:
            answers = srv.complete_all([prompt] * n_par, lossless.N_PREDICT, parallel=n_par)
        assert all(lossless.same_greedy_output(a["content"], pair.alone[prompt][1]) for a in answers), answers
        accepted["server"] |= {a["timings"]["draft_n_accepted"] for a in answers}
        logs["server"][f"-np {n_par} -ub {ub} -b {b}"] = path.read_text(errors="replace")
    print("\naccepted per program:", accepted)
    for program, runs in logs.items():
        assert len(accepted[program]) == 1 and min(accepted[program]) > 0, (program, accepted)
        steps = {}
        for name, log in runs.items():
            checked, breaks = lossless.chain_breaks(log, pair.bigrams)
            assert checked > 0 and not breaks, (program, name, breaks)
            steps.update({f"{name} seq {seq}": chains for seq, chains in lossless.drafted_chains(log).items()})
        first = next(iter(steps.values()))
        for name, chains in steps.items():
            assert abs(len(chains) - len(first)) <= 1, (program, name, len(chains), len(first))
            for i, (a, c) in enumerate(zip(first, chains)):
                assert a[:len(c)] == c[:len(a)], (program, name, i, a, c)

"""The pair over llama.cpp's RPC backend (Kimi-K3 is spread over hosts that way), loopback only.

Two ggml-rpc-servers on free ports hold the deep tiny Kimi-K3 target, split by layer (layers
on both remote devices); the bigram-biased MLA DSpark draft runs on this host or on a server.
Greedy output must equal the target alone run locally (llama-simple, no RPC), with drafts the
target partly accepts, flash attention off and on, for llama-speculative-simple and for
llama-server with two slots in flight. The draft's logits through RPC equal the local ones.
Faults: a server killed mid-generation ends llama-speculative-simple with exit status 1, and
fails llama-server's requests with an error while the server stays up, in bounded time, with a
line naming the lost server; a port that speaks something else is refused.

Thread budgets: 2 cores run up to three llama.cpp processes here, and idle ggml workers spin,
so every process gets one thread (-t/-td, rpc-server -t).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import numpy as np
import pytest

from llamacpp_mla_port.proof import lossless, parity
from llamacpp_mla_port.proof.rpc import DRAFT_PLACEMENTS, draft_args, placement, rpc_devices, target_split_args
from llamacpp_mla_port.proof.run.draft_logits import run_draft_logits
from llamacpp_mla_port import process
from llamacpp_mla_port.proof.run.processes import LOCALHOST, Owned, RpcServer, free_port
from llamacpp_mla_port.proof.run.programs import compile_program

pytestmark = pytest.mark.build

N_PROMPTS = 8            # the bigram draft learns from the first half: partial acceptance
DRAFT_MAX = 7            # what Kimi-K3-DSpark drafts per pass
THREADS = ["-t", "1", "-td", "1"]
# a connection that answers nothing is refused after this (the default, 10 s, is too slow for CI)
CONNECT_TIMEOUT_S = 2
FAULT_BOUND_S = 60       # a generous bound against hangs; the measured exits take well under 1 s
LOST = "the connection is lost"
UNUSABLE = "the device is now unusable"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("rpc")


@pytest.fixture(scope="module")
def pair(patched_tree, llama_build, work):
    from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
    base = write_kimi_k3_target(llama_build, work / "kimi-k3.gguf")
    return lossless.prepare_pair(patched_tree, llama_build, work / "pair", base, N_PROMPTS, draft_names=("bigram",))


@contextlib.contextmanager
def _two_servers(llama_build, log_dir):
    """Two rpc-servers on free loopback ports, one thread each; every one started is stopped."""
    started: list[RpcServer] = []
    try:
        for i in range(2):
            started.append(RpcServer(llama_build, log_dir / f"rpc{i}.log", threads=1))
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def servers(llama_build, work):
    """Two rpc-servers for the lossless tests (the fault tests start their own)."""
    with _two_servers(llama_build, work) as started:
        yield started


def _endpoints(servers) -> list[str]:
    return [s.endpoint for s in servers]


def _spec_cmd(build, pair, servers, where: str, prompt: str, n_predict: int, extra=()) -> list[str]:
    return [str(build / "bin" / "llama-speculative-simple"), "-m", str(pair.target), "-md", str(pair.drafts["bigram"]),
            "--spec-type", "draft-dspark", "--spec-draft-n-max", str(DRAFT_MAX), "-p", prompt, "-n", str(n_predict),
            "--temp", "0", "--top-k", "1", "-s", "1", *THREADS, *target_split_args(_endpoints(servers)),
            *draft_args(where, len(servers)), *extra]


# ------------------------------------------------------------------------------ lossless

@pytest.mark.parametrize("where", DRAFT_PLACEMENTS)
def test_models_land_on_both_remote_devices(llama_build, pair, servers, where):
    proc = process.run(_spec_cmd(llama_build, pair, servers, where, pair.prompts[0], 4, ["-v"]), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    placed = placement(proc.stderr)
    print(f"placement, draft {where}: {placed}")
    remote = set(rpc_devices(len(servers)))
    assert set(placed["target"]) == remote and min(placed["target"].values()) >= 2, placed
    if where == "remote":
        assert set(placed["draft"]) == {rpc_devices(len(servers))[-1]}, placed
    else:
        assert set(placed["draft"]) == {"CPU"}, placed


# two of the four (placement x flash attention) pairs in make test, every pair in make test-slow
@pytest.mark.parametrize("where,flash_attn", [
    pytest.param(w, fa, id=f"{w}-{'fa-on' if fa else 'fa-off'}", marks=() if (w == "local") != fa else pytest.mark.slow)
    for w in DRAFT_PLACEMENTS for fa in (False, True)])
def test_speculative_simple_over_rpc_equals_the_target_alone(llama_build, pair, servers, where, flash_attn):
    extra = [*THREADS[2:], *target_split_args(_endpoints(servers)), *draft_args(where, len(servers))]
    identical = drafted = accepted = 0
    mismatches = []
    for prompt in pair.prompts:
        run = lossless.speculative_simple(llama_build, pair.target, pair.drafts["bigram"], prompt, DRAFT_MAX,
                                          flash_attn, 0.0, threads=1, extra=extra)
        drafted += run.n_drafted
        accepted += run.n_accepted
        if lossless.same_greedy_output(run.text, pair.alone[prompt][0]):
            identical += 1
        else:
            mismatches.append((prompt, run.text, pair.alone[prompt][0]))
    print(f"rpc speculative-simple draft {where} fa={'on' if flash_attn else 'off'}: "
          f"{identical}/{len(pair.prompts)} identical, drafted {drafted}, accepted {accepted}")
    assert not mismatches, mismatches[:3]
    assert 0 < accepted < drafted, (drafted, accepted)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_server_two_slots_over_rpc_equals_the_target_alone(llama_build, pair, servers, work, flash_attn):
    extra = [*THREADS[2:], *target_split_args(_endpoints(servers)), *draft_args("remote", len(servers))]
    with lossless.Server(llama_build, pair.target, pair.drafts["bigram"], DRAFT_MAX, flash_attn, 0.0,
                         work / f"server-fa{int(flash_attn)}.log", parallel=2, threads=1, extra=extra) as srv:
        results = srv.complete_all(pair.prompts, lossless.N_PREDICT, parallel=2)
    identical = drafted = accepted = 0
    mismatches = []
    for prompt, res in zip(pair.prompts, results):
        if lossless.same_greedy_output(res.get("content", ""), pair.alone[prompt][1]):
            identical += 1
        else:
            mismatches.append((prompt, res.get("content"), pair.alone[prompt][1]))
        drafted += int(res.get("timings", {}).get("draft_n", 0))
        accepted += int(res.get("timings", {}).get("draft_n_accepted", 0))
    print(f"rpc server -np 2 draft remote fa={'on' if flash_attn else 'off'}: "
          f"{identical}/{len(pair.prompts)} identical, drafted {drafted}, accepted {accepted}")
    assert not mismatches, mismatches[:3]
    assert 0 < accepted < drafted, (drafted, accepted)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_draft_logits_through_rpc_equal_the_local_ones(patched_tree, llama_build, pair, servers, work, flash_attn):
    """Features, injected latent rows and the block cross the RPC boundary: both models'
    layers split over the two servers (the draft's devices must include the one holding the
    target's lm_head, which it projects with); F32 weights and cache."""
    from llamacpp_mla_port.proof.reference.model import DraftReference, nmse, read_target_head
    embd, _ = read_target_head(pair.target)
    vocab, hidden = embd.shape
    pcfg = parity.PARITY_CONFIGS[0]
    ckpt, draft = parity.make_draft(patched_tree, work / "logits", pcfg, hidden, vocab, "float32")
    ref = DraftReference.load(ckpt, pair.target)
    binary = compile_program("draft-logits", patched_tree, llama_build)
    feats = np.random.default_rng(11).normal(size=(40, ref.config.n_taps * hidden)).astype(np.float32)
    ids = [3] + [ref.config.mask_token_id] * (pcfg.block_size - 1)
    common = dict(ctx_pos0=100, flash_attn=flash_attn, cache_type="f32", threads=1)
    local = run_draft_logits(binary, draft, pair.target, feats, ids, work / f"dl-local-{flash_attn}", **common)
    devices = ",".join(rpc_devices(len(servers)))
    remote = run_draft_logits(binary, draft, pair.target, feats, ids, work / f"dl-rpc-{flash_attn}",
                              rpc=",".join(_endpoints(servers)), draft_devices=devices,
                              target_devices=devices, **common)
    vs_local = {name: nmse(getattr(remote, name), getattr(local, name))
                for name in ("biased_logits", "base_logits", "hidden")}
    want = ref.forward(feats.astype(np.float64), ids, ctx_positions=100 + np.arange(len(feats)))
    vs_reference = parity.compare(remote, want)["nmse_base_logits"]
    print(f"draft logits through RPC, F32 cache, fa={'on' if flash_attn else 'off'}: NMSE vs local {vs_local}, "
          f"base logits vs the float64 reference {vs_reference:.3g}")
    assert all(v <= 1e-9 for v in vs_local.values()), vs_local
    assert np.array_equal(remote.chain, local.chain)
    if not flash_attn:     # parity's F32 bound (CPU flash attention has its own, looser one)
        assert vs_reference <= 1e-9, vs_reference
    assert remote.meta["draft_devices"] == devices == remote.meta["target_devices"]
    log = (remote.out_dir / "llama.log").read_text()
    assert all(f"RPC0[{e}] model buffer size" in log for e in _endpoints(servers)), log[-3000:]


# ------------------------------------------------------------------------------ faults

@pytest.fixture
def own_servers(llama_build, tmp_path):
    """Two fresh rpc-servers per fault test (one of them gets killed)."""
    with _two_servers(llama_build, tmp_path) as started:
        yield started


# generated text: the test tokenizer renders ids as hex, so a long hex run means tokens are flowing
GENERATING = r"[0-9a-f]{40}"


@pytest.mark.parametrize("victim", [0, 1], ids=["first-server", "last-server"])
def test_killed_rpc_server_ends_the_client_with_an_error(llama_build, pair, own_servers, tmp_path, victim):
    cmd = _spec_cmd(llama_build, pair, own_servers, "remote", pair.prompts[0], 3000, ["-c", "4096", "--ignore-eos"])
    with Owned(cmd, tmp_path / "client.log", name="llama-speculative-simple") as client:
        client.wait_log(GENERATING, seconds=120)
        own_servers[victim].kill()
        t0 = time.monotonic()
        rc = client.wait(FAULT_BOUND_S)
        took = time.monotonic() - t0
        log = client.log_tail(20000)
    print(f"client after killing server {victim}: exit {rc} in {took:.2f} s")
    assert rc == 1, log[-3000:]
    assert f"RPC server {own_servers[victim].endpoint}: " in log and LOST in log and UNUSABLE in log, log[-3000:]


def _request_outcome(srv, prompt: str, n_predict: int) -> str:
    """'completed', or 'error <HTTP status>: <the server's message>' (or the transport error)."""
    import urllib.error
    try:
        srv.complete(prompt, n_predict)
        return "completed"
    except urllib.error.HTTPError as err:
        return f"error {err.code}: {err.read().decode(errors='replace')[:300]}"
    except Exception as err:       # the connection itself failed: not the answer we want
        return f"transport {err!r}"


def test_killed_rpc_server_fails_llama_server_requests_with_an_error(llama_build, pair, own_servers, tmp_path):
    """As upstream's #26724 has it: llama-server stays up, answers the requests in flight with
    an error, says which server is lost, and answers the next request with an error too."""
    extra = [*THREADS[2:], *target_split_args(_endpoints(own_servers)), *draft_args("remote", len(own_servers))]
    srv = lossless.Server(llama_build, pair.target, pair.drafts["bigram"], DRAFT_MAX, False, 0.0,
                          tmp_path / "server.log", parallel=2, threads=1, extra=extra)
    outcomes: dict[int, str] = {}

    def request(i: int) -> None:
        outcomes[i] = _request_outcome(srv, pair.prompts[i], 4000)

    with srv:
        threads = [threading.Thread(target=request, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        try:
            srv.owned.wait_log(r"(?s)launch_slot_.*launch_slot_", seconds=120)   # both slots busy
            time.sleep(0.3)
            own_servers[1].kill()
            t0 = time.monotonic()
        finally:
            for t in threads:
                t.join(FAULT_BOUND_S)
        took = time.monotonic() - t0
        alive = srv.owned.alive()
        after = _request_outcome(srv, pair.prompts[2], 8) if alive else "not asked: the server is gone"
        log = srv.owned.log_tail(20000)
    print(f"llama-server after killing a server: requests ended in {took:.2f} s: {outcomes}; "
          f"still up: {alive}; the next request: {after}")
    assert not any(t.is_alive() for t in threads), "a request hung"
    assert sorted(outcomes) == [0, 1] and all(o.startswith("error 5") for o in outcomes.values()), outcomes
    assert alive, log[-3000:]
    assert after.startswith("error 5"), after
    assert f"RPC server {own_servers[1].endpoint}: " in log and LOST in log and UNUSABLE in log, log[-3000:]


# ports that accept every connection and then say nothing, or answer at once with something
# else (an SSH banner); wait_port's probe is one of the connections
FOREIGN = {
    "silent": "import socket\ns = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\nkept = []\n"
              "while True:\n    kept.append(s.accept()[0])\n",
    "banner": "import socket\ns = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen()\nkept = []\n"
              "while True:\n    c = s.accept()[0]; kept.append(c)\n"
              "    try:\n        c.sendall(b'SSH-2.0-OpenSSH_9.6\\r\\n' * 8)\n    except OSError:\n        pass\n",
}


@pytest.mark.parametrize("kind", ["http-server", "silent", "banner", "nothing-listening"])
def test_a_port_that_is_not_an_rpc_server_is_refused(llama_build, pair, own_servers, tmp_path, kind):
    port = free_port()
    if kind == "http-server":
        cmd = [sys.executable, "-m", "http.server", "--bind", LOCALHOST, str(port)]
    elif kind in FOREIGN:
        cmd = [sys.executable, "-c", FOREIGN[kind].format(port=port)]
    else:
        cmd = None
    foreign = Owned(cmd, tmp_path / "foreign.log", name=kind) if cmd else None
    try:
        if foreign:
            foreign.wait_port(port, seconds=60)
        # the foreign port first: the client refuses it before it contacts the genuine server, so
        # the short connect limit never applies to a real handshake on a loaded machine
        servers = [f"{LOCALHOST}:{port}", own_servers[0].endpoint]
        cmd_client = _spec_cmd(llama_build, pair, own_servers, "local", "x", 4)
        cmd_client[cmd_client.index(",".join(_endpoints(own_servers)))] = ",".join(servers)
        env = dict(os.environ, GGML_RPC_CONNECT_TIMEOUT=str(CONNECT_TIMEOUT_S))
        t0 = time.monotonic()
        proc = process.run(cmd_client, timeout=FAULT_BOUND_S, env=env)
        took = time.monotonic() - t0
    finally:
        if foreign:
            foreign.stop()
    print(f"client against a {kind} port: exit {proc.returncode} in {took:.2f} s")
    err = proc.stderr
    assert proc.returncode == 1, err[-3000:]
    assert f"cannot use RPC server {LOCALHOST}:{port}" in err, err[-3000:]
    reason = {"http-server": "did not answer the handshake", "silent": "did not answer the handshake",
              "banner": "not the ggml RPC protocol", "nothing-listening": "Connection refused"}[kind]
    assert reason in err, err[-3000:]

"""llama-server -np 2 with the MLA DSpark draft holds under concurrent load (proof/load.py).

200 measured requests (after 100 warm-up ones) from 8 concurrent clients, short to long
prompts, plain, streamed and cancelled-mid-stream requests, against the server with the
bigram MLA draft and against the target alone. Every completed greedy response equals the
target-alone continuation, /health answers throughout, RSS does not grow between the first
and the last 50 requests. Requests per second with and without the draft: printed, not
asserted.
"""

from __future__ import annotations

import pytest

from llamacpp_mla_port.fixtures.target import write_kimi_k3_target
from llamacpp_mla_port.proof.load import check_load, run_load_test

pytestmark = pytest.mark.build


def test_server_with_the_draft_holds_under_concurrent_load(llama_build, patched_tree, tmp_path):
    base = write_kimi_k3_target(llama_build, tmp_path / "kimi-k3-tiny.gguf")
    report = run_load_test(patched_tree, llama_build, tmp_path / "load", base)
    for name in ("with_draft", "target_alone"):
        r = report[name]
        print(f"\n{name}: {r['requests']} requests, {r['completed']} completed ({r['streamed_complete']} streamed), "
              f"{r['cancelled']} cancelled mid-stream, {r['health_polls']} /health polls; RSS max first 50 "
              f"{r['rss_first50_max_kib']} KiB, last 50 {r['rss_last50_max_kib']} KiB; {r['requests_per_second']} "
              f"req/s; drafted {r['drafted']}, accepted {r['accepted']}")
    print(f"req/s with the draft / target alone: {report['req_per_s_ratio_draft_vs_alone']}")
    assert check_load(report) == []
    assert report["with_draft"]["completed"] >= 150 and report["with_draft"]["cancelled"] >= 10
    assert report["prompt_tokens"]["max"] >= 5 * report["prompt_tokens"]["min"]

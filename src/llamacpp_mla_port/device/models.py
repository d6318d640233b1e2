"""The device check's model files, written by one background process while the build runs
(`python -m llamacpp_mla_port.device.models JOBS.json DONE.json`), in the order of the jobs:
each job's result (paths, sizes, seconds) or error lands in DONE.json as soon as it is done,
so a stage waits only for its own files (`wait_model`).

Job kinds:
  realsize  {"tiny": TINY_TARGET, "out": DIR, "reduced": bool}   fixtures.realsize's pair
  standard  {"shape": NAME, "qtype": T, "n_layer": N, "out": FILE}  fixtures.standard_model
  twin      {"config": HF_CONFIG, "weights": T, "out": FILE}       fixtures.deepseek2_twin
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

from llamacpp_mla_port.errors import DeviceCheckError
from llamacpp_mla_port.fixtures.deepseek2_twin import write_deepseek2_twin
from llamacpp_mla_port.fixtures.realsize import write_realsize_pair
from llamacpp_mla_port.fixtures.standard_model import write_standard_model
from llamacpp_mla_port.jsonfile import write_json


#: the dry run's stand-in for DeepSeek-V2-Lite: its MLA (16 heads over the 512 + 64 latent,
#: qk_nope = v_head = 128), one layer, a small width and vocabulary (fixtures.deepseek2_twin)
REDUCED_V2_LITE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 16,
                   "q_lora_rank": 128, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                   "v_head_dim": 128, "vocab_size": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 4096}
#: the reproducer's model on the device: DeepSeek-V2-Lite's shapes, its first (dense) layer
REPRO_MODEL = ("deepseek-v2-lite", "q8_0", 1)


def plan_jobs(stages, work: Path, fixtures: Path, dry_run: bool, variants: dict) -> dict[str, dict]:
    """The files the chosen stages need, in the order the stages run (`variants`: the bundle's
    variants.json, for the thread rows' bench tables)."""
    models = Path(work) / "models"
    jobs: dict[str, dict] = {}

    def standard(shape: str, qtype: str, n_layer: int) -> dict:
        if dry_run:
            return {"kind": "twin", "config": REDUCED_V2_LITE, "weights": "q8_0",
                    "out": str(models / "reduced-v2-lite-q8_0.gguf")}
        return {"kind": "standard", "shape": shape, "qtype": qtype, "n_layer": n_layer,
                "out": str(models / f"{shape}-{n_layer}L-{qtype}.gguf")}

    if {"realsize", "vb-forms"} & set(stages):
        jobs["realsize"] = {"kind": "realsize", "tiny": str(Path(fixtures) / "kimi-k3-target.gguf"), "reduced": dry_run,
                            "out": str(Path(work) / ("realsize-reduced" if dry_run else "realsize"))}
    if "host" in stages:
        jobs["repro"] = standard(*REPRO_MODEL)
    if "threads" in stages:
        for name, st in variants.get("stacks", {}).items():
            bench = st.get("bench")
            for qtype in (bench or {}).get("types", ()):
                jobs[f"{name}:{qtype}"] = standard(bench.get("shape", "llama-3.2-3b"), qtype, bench.get("n_layer", 4))
    return jobs


def write_job(job: dict) -> dict:
    """One job's files (module doc); what it wrote."""
    t0 = time.monotonic()
    if job["kind"] == "realsize":
        res = write_realsize_pair(Path(job["tiny"]), Path(job["out"]), reduced=job["reduced"])
    elif job["kind"] in ("standard", "twin"):
        path = (write_standard_model(job["shape"], job["qtype"], Path(job["out"]), job["n_layer"])
                if job["kind"] == "standard" else write_deepseek2_twin(job["config"], job["weights"], Path(job["out"])))
        res = {"path": str(path), "bytes": path.stat().st_size}
    else:
        raise DeviceCheckError(f"unknown model job kind {job['kind']!r}", hint="realsize, standard or twin")
    return {**res, "job": job, "seconds": round(time.monotonic() - t0, 1)}


def write_all(jobs: dict[str, dict], done: Path) -> int:
    results: dict = {}
    for key, job in jobs.items():
        try:
            results[key] = write_job(job)
        except Exception as err:          # recorded for the stage that waits on it
            results[key] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-2000:]}
        write_json(done, results, indent=1)
    return 0 if all("error" not in r for r in results.values()) else 1


def wait_model(done: Path, key: str, alive, timeout: float, log_tail=lambda: "") -> dict:
    """The result of job `key` from DONE.json, waiting while the writer is `alive()` (at most
    `timeout` seconds); DeviceCheckError with the writer's log when it failed or never wrote it."""
    deadline = time.monotonic() + timeout
    while True:
        results = json.loads(done.read_text()) if done.is_file() else {}
        if key in results:
            if "error" in results[key]:
                raise DeviceCheckError(f"writing the model {key} failed: {results[key]['error']}",
                                       hint=results[key].get("traceback", "")[-800:])
            return results[key]
        if not alive():
            raise DeviceCheckError(f"the model writer ended without writing {key}", hint=log_tail())
        if time.monotonic() > deadline:
            raise DeviceCheckError(f"the model {key} was not written within {timeout:.0f} s", hint=log_tail())
        time.sleep(0.5)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m llamacpp_mla_port.device.models JOBS.json DONE.json")
    sys.exit(write_all(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])))

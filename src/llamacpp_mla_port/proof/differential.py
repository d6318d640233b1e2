"""The doctor against the loader: metadata and tensor-header mutants of loadable drafts.

Design and bounds: docs/proof.md#differential.
"""

from __future__ import annotations

import copy
import re
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from llamacpp_mla_port.errors import ProofError
from llamacpp_mla_port import process

#: What the doctor may refuse although llama.cpp loads and drafts: mutant id (base:what:op)
#: -> (doctor check that must say so, the semantic reason). Anything else the doctor fails
#: while the loader accepts is a test failure; an entry that no longer shows up is one too.
DELIBERATE: dict[str, tuple[str, str]] = {
    "mla:tokenizer.ggml.model:=llama": (
        "target_tokenizer", "the draft's tokenizer is another kind than the target's (llama vs test): llama.cpp "
        "compares vocabulary sizes and the mask token, not the tokenizers, and drafts from mismatched ids"),
    "qwen3:tokenizer.ggml.model:=llama": (
        "target_tokenizer", "the draft's tokenizer is another kind than the target's (llama vs test): llama.cpp "
        "compares vocabulary sizes and the mask token, not the tokenizers, and drafts from mismatched ids"),
    "mla:dflash.rope.scaling.factor:delete": (
        "rope", "missing YaRN key: without rope.scaling.factor llama.cpp runs the YaRN draft unscaled "
        "(factor 1), not the rotation it was trained with"),
    "mla:dflash.rope.scaling.original_context_length:delete": (
        "rope", "missing YaRN key: llama.cpp falls back to context_length as the original context, "
        "another YaRN ramp than the trained one"),
}

#: Files the loader may abort on although nothing is wrong with them: defects of the
#: runtime, not of the file, so not the doctor's to refuse (mutant id pattern -> why).
#: They count apart; on a machine where the runtime takes them they simply agree.
KNOWN_LOADER_DEFECTS: dict[str, str] = {
    r"mla:blk\.\d+\.attn_[kv]_b\.weight:f16":
        "ggml's CPU extra buffer type (AMX on this -march=native Sapphire Rapids build) takes the 3-D F16 "
        "k_b/v_b and no backend then runs their batched mat-mul: GGML_ASSERT(*cur_backend_id != -1); "
        "the same file runs with --no-repack, and as BF16",
}


@dataclass(frozen=True)
class Mutant:
    base: str        # which loadable draft it derives from ("mla", "qwen3")
    what: str        # the key or tensor name
    op: str          # delete | zero | plus1 | huge | flip | empty | shorten | lengthen | shift | =VALUE | ne0+1 | f16

    @property
    def id(self) -> str:
        return f"{self.base}:{self.what}:{self.op}"


@dataclass
class LoaderResult:
    verdict: str     # accepted | refused | abort | hang
    stage: str
    message: str


@dataclass
class Outcome:
    mutant: Mutant
    loader: LoaderResult
    doctor_exit: int
    doctor_errors: list[tuple[str, str]] = field(default_factory=list)   # (check, title)
    doctor_alone_exit: int = 2       # the doctor without --target

    @property
    def draft_alone_refused(self) -> bool:
        """The loader refused the draft before it met the target (or died on it)."""
        return self.loader.verdict in ("abort", "hang") or self.loader.stage == "load"

    @property
    def doctor_passes(self) -> bool:
        return self.doctor_exit < 2

    @property
    def loader_accepts(self) -> bool:
        return self.loader.verdict == "accepted"


# ---------------------------------------------------------------------------------------
# reading and writing a draft as data

@dataclass
class Draft:
    """A GGUF as editable lists: (key, value, type, item type) and (name, array, ggml type)."""

    arch: str
    kvs: list[tuple[str, Any, Any, Any]]
    tensors: list[tuple[str, np.ndarray, Any]]

    @classmethod
    def read(cls, path: Path) -> "Draft":
        from gguf import GGUFReader, GGUFValueType as T

        reader = GGUFReader(str(path))
        arch = reader.fields["general.architecture"].contents()
        kvs = []
        for name, f in reader.fields.items():
            if name.startswith("GGUF.") or name == "general.architecture":
                continue
            vtype = f.types[0]
            kvs.append((name, f.contents(), vtype, f.types[-1] if vtype == T.ARRAY else None))
        tensors = [(t.name, np.array(t.data), t.tensor_type) for t in reader.tensors]
        return cls(arch, kvs, tensors)

    def write(self, path: Path, arch: str | None = None, drop_arch: bool = False) -> Path:
        import gguf

        writer = gguf.GGUFWriter(str(path), arch=self.arch if arch is None else arch)
        if drop_arch:
            writer.kv_data[0].pop("general.architecture", None)
        for name, value, vtype, sub in self.kvs:
            writer.add_key_value(name, value, vtype, sub)
        for name, data, ttype in self.tensors:
            writer.add_tensor(name, np.ascontiguousarray(data), raw_dtype=ttype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path


# ---------------------------------------------------------------------------------------
# mutants

_INT_MAX = {"UINT8": 2**8 - 1, "INT8": 2**7 - 1, "UINT16": 2**16 - 1, "INT16": 2**15 - 1,
            "UINT32": 2**32 - 1, "INT32": 2**31 - 1, "UINT64": 2**64 - 1, "INT64": 2**63 - 1}
TOKENIZER_SWAPS = ("gpt2", "llama")


def _value_ops(name: str, value: Any, vtype: Any, sub: Any) -> list[tuple[str, Any]]:
    """(op, new value) for one key; the value keeps its type."""
    from gguf import GGUFValueType as T

    if vtype == T.BOOL:
        return [("flip", not value)]
    if vtype.name in _INT_MAX:
        return [("zero", 0), ("plus1", min(int(value) + 1, _INT_MAX[vtype.name])), ("huge", _INT_MAX[vtype.name])]
    if vtype in (T.FLOAT32, T.FLOAT64):
        return [("zero", 0.0), ("plus1", float(value) + 1.0), ("huge", 1e30)]
    if vtype == T.STRING:
        ops: list[tuple[str, Any]] = [("empty", "")] if value != "" else []
        if name == "tokenizer.ggml.model":
            ops += [(f"={v}", v) for v in TOKENIZER_SWAPS if v != value]
        return ops
    if vtype == T.ARRAY:
        ops = []
        if len(value) > 1:
            ops.append(("shorten", list(value[:-1])))
        if len(value) > 0:
            ops.append(("lengthen", list(value) + [value[-1]]))
        if sub is not None and sub.name in _INT_MAX and value:
            ops.append(("shift", [int(v) + 1 for v in value]))
        return ops
    return []


def mutants(base: str, draft: Draft) -> list[tuple[Mutant, Callable[[Path], Path]]]:
    """Every single-change mutant of `draft`, with a writer for it."""
    from gguf import GGMLQuantizationType as Q

    out: list[tuple[Mutant, Callable[[Path], Path]]] = []

    def with_kvs(kvs):
        d = copy.copy(draft)
        d.kvs = kvs
        return d

    out.append((Mutant(base, "general.architecture", "empty"), lambda p: draft.write(p, arch="")))
    out.append((Mutant(base, "general.architecture", "delete"), lambda p: draft.write(p, drop_arch=True)))
    for i, (name, value, vtype, sub) in enumerate(draft.kvs):
        rest = draft.kvs[:i] + draft.kvs[i + 1:]
        out.append((Mutant(base, name, "delete"), lambda p, rest=rest: with_kvs(rest).write(p)))
        for op, new in _value_ops(name, value, vtype, sub):
            kvs = list(draft.kvs)
            kvs[i] = (name, new, vtype, sub)
            out.append((Mutant(base, name, op), lambda p, kvs=kvs: with_kvs(kvs).write(p)))
    for i, (name, data, ttype) in enumerate(draft.tensors):
        grown = np.pad(data, [(0, 0)] * (data.ndim - 1) + [(0, 1)])
        ts = list(draft.tensors)
        ts[i] = (name, grown, ttype)
        out.append((Mutant(base, name, "ne0+1"), lambda p, ts=ts: _with_tensors(draft, ts).write(p)))
        if ttype == Q.F32:
            ts = list(draft.tensors)
            ts[i] = (name, data.astype(np.float16), Q.F16)
            out.append((Mutant(base, name, "f16"), lambda p, ts=ts: _with_tensors(draft, ts).write(p)))
    return out


def _with_tensors(draft: Draft, tensors) -> Draft:
    d = copy.copy(draft)
    d.tensors = tensors
    return d


# ---------------------------------------------------------------------------------------
# the two judges

def run_loader(binary: Path, target: Path, paths: list[Path], threads: int = 1,
               seconds_per_file: int = 20) -> list[LoaderResult]:
    """load-check on every path, restarting after a file that aborts (or hangs) the process."""
    results: list[LoaderResult | None] = [None] * len(paths)
    start = 0
    env = {"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"}
    with tempfile.TemporaryDirectory() as tmp:
        while start < len(paths):
            lst = Path(tmp) / "list.txt"
            lst.write_text("".join(f"{p}\n" for p in paths[start:]))
            proc = process.run([binary, "--target", target, "--list", lst, "--threads", threads,
                                "--seconds", seconds_per_file],
                               timeout=120 + len(paths) * seconds_per_file, env=env)
            last_begin = None
            for line in proc.stdout.splitlines():
                parts = line.split("\t")
                if parts[0] == "BEGIN":
                    last_begin = start + int(parts[1])
                elif parts[0] == "END" and len(parts) >= 5:
                    results[start + int(parts[1])] = LoaderResult(parts[2], parts[3], parts[4])
            if proc.returncode == 0:
                break
            if last_begin is None or results[last_begin] is not None:
                raise ProofError(f"load-check failed (exit {proc.returncode}) outside a draft:\n{proc.stderr[-2000:]}",
                                 hint=f"{binary} --target {target}")
            tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
            hang = proc.returncode == -signal.SIGALRM
            results[last_begin] = LoaderResult("hang" if hang else "abort", f"exit {proc.returncode}",
                                               f"no result within {seconds_per_file} s" if hang
                                               else " | ".join(tail)[-600:])
            start = last_begin + 1
    missing = [paths[i] for i, r in enumerate(results) if r is None]
    if missing:
        raise ProofError(f"load-check gave no result for {len(missing)} files, e.g. {missing[0]}")
    return results  # type: ignore[return-value]


def run_doctor(path: Path, target: Path | None) -> tuple[int, list[tuple[str, str]]]:
    """The doctor's exit code and its error findings (a GGUFError is exit 2)."""
    from llamacpp_mla_port.doctor.diagnose import diagnose
    from llamacpp_mla_port.errors import GGUFError

    try:
        report, findings = diagnose(path, target)
    except GGUFError as err:
        return 2, [("gguf", str(err).splitlines()[0])]
    return report["exit_code"], [(f.check, f.title) for f in findings if f.verdict == "error"]


# ---------------------------------------------------------------------------------------
# the comparison

def known_defect(mutant: Mutant) -> str | None:
    return next((why for pat, why in KNOWN_LOADER_DEFECTS.items() if re.fullmatch(pat, mutant.id)), None)


def compare(outcomes: Iterable[Outcome], deliberate: dict[str, tuple[str, str]] = DELIBERATE) -> dict:
    agree, violations, deliberate_seen, unexpected, defects = [], [], [], [], []
    for o in outcomes:
        if not o.loader_accepts and o.doctor_passes and known_defect(o.mutant):
            defects.append(o)
        elif o.draft_alone_refused and o.doctor_alone_exit < 2:
            violations.append(o)        # without --target the doctor must see it too
        elif o.loader_accepts == o.doctor_passes:
            agree.append(o)
        elif not o.loader_accepts:
            violations.append(o)
        else:
            want = deliberate.get(o.mutant.id)
            if want and any(check == want[0] for check, _ in o.doctor_errors):
                deliberate_seen.append(o)
            else:
                unexpected.append(o)
    return {"agree": agree, "violations": violations, "deliberate": deliberate_seen, "unexpected": unexpected,
            "loader_defects": defects}


def differential(load_check: Path, target: Path, bases: dict[str, Path], work: Path, threads: int = 1,
                 batch: int = 96, log: Callable[[str], None] = print) -> dict:
    """Mutate every base draft, judge every mutant both ways; the report (see compare)."""
    t0 = time.monotonic()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    base_results = run_loader(load_check, target, list(bases.values()), threads)
    for (name, path), res in zip(bases.items(), base_results):
        code, errors = run_doctor(path, target)
        if res.verdict != "accepted" or code >= 2:
            raise ProofError(f"base draft {name} is not loadable by both: loader {res}, doctor exit {code} {errors}")
    todo = [m for name, path in bases.items() for m in mutants(name, Draft.read(path))]
    for off in range(0, len(todo), batch):
        chunk = todo[off:off + batch]
        paths = [writer(work / f"m{off + i}.gguf") for i, (_, writer) in enumerate(chunk)]
        for (m, _), path, res in zip(chunk, paths, run_loader(load_check, target, paths, threads)):
            code, errors = run_doctor(path, target)
            outcomes.append(Outcome(m, res, code, errors, run_doctor(path, None)[0]))
        for p in paths:
            p.unlink(missing_ok=True)
    verdict = compare(outcomes)
    report = {
        "mutants": len(outcomes),
        "loader_accepts": sum(o.loader_accepts for o in outcomes),
        "loader_refuses": sum(o.loader.verdict == "refused" for o in outcomes),
        "loader_aborts": [f"{o.mutant.id}: {o.loader.verdict}: {o.loader.message}" for o in outcomes
                          if o.loader.verdict in ("abort", "hang")],
        "agreements": len(verdict["agree"]),
        "deliberate": [f"{o.mutant.id}: {DELIBERATE[o.mutant.id][1]}" for o in verdict["deliberate"]],
        "violations": [f"{o.mutant.id}: loader {o.loader.verdict} ({o.loader.stage}: {o.loader.message[:300]}); "
                       f"doctor exit {o.doctor_exit} (alone {o.doctor_alone_exit})" for o in verdict["violations"]],
        "unexpected": [f"{o.mutant.id}: doctor {o.doctor_errors}" for o in verdict["unexpected"]],
        "loader_defects": [f"{o.mutant.id}: {known_defect(o.mutant)}" for o in verdict["loader_defects"]],
        "seconds": round(time.monotonic() - t0, 1),
        "outcomes": outcomes,
    }
    log(f"differential: {report['mutants']} mutants, {report['agreements']} agreements, "
        f"{len(report['deliberate'])} deliberate differences, {len(report['violations'])} violations, "
        f"{len(report['unexpected'])} unexpected, {len(report['loader_defects'])} known loader defects, "
        f"{len(report['loader_aborts'])} loader aborts or hangs "
        f"({report['seconds']} s)")
    return report

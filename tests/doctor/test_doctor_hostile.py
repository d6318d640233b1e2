"""Hostile and broken GGUFs: each gives one clean GGUFError (or a verdict), never a crash.

The corpus is built byte by byte so every field can be corrupted on purpose; the fuzz
test mutates valid files (the hand-built one and a tiny MLA draft written by the gguf
writer) with hypothesis.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from gguf.constants import GGUFValueType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.doctor_gguf import write_mla_draft
from llamacpp_mla_port.cli import main
from llamacpp_mla_port.doctor.checks import exit_code, run_checks
from llamacpp_mla_port.errors import GGUFError
from llamacpp_mla_port.gguf.header import encode_kv, read_header


def s(b: bytes | str) -> bytes:
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def tinfo(name: str, dims: list[int], type_id: int = 0, offset: int = 0, n_dims: int | None = None) -> bytes:
    n = len(dims) if n_dims is None else n_dims
    dims_raw = b"".join(struct.pack("<q", d) for d in dims)
    return s(name) + struct.pack("<I", n) + dims_raw + struct.pack("<IQ", type_id, offset)


def gguf(kvs: list[bytes] | None = None, tensors: list[bytes] | None = None, data: bytes | None = None,
         *, magic: bytes = b"GGUF", version: int = 3, n_tensors: int | None = None, n_kv: int | None = None,
         alignment: int = 32) -> bytes:
    kvs = [encode_kv("general.architecture", T.STRING, "dflash")] if kvs is None else kvs
    tensors = [tinfo("a.weight", [8]), tinfo("b.weight", [4, 2], offset=32)] if tensors is None else tensors
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tensors)
    head += b"\0" * (-len(head) % alignment)
    if data is None:
        data = b"\1" * 32 + b"\2" * 32
    return head + data


def valid() -> bytes:
    return gguf()


def expect_error(tmp_path: Path, blob: bytes, needle: str) -> str:
    p = tmp_path / "bad.gguf"
    p.write_bytes(blob)
    with pytest.raises(GGUFError) as err:
        read_header(p)
    msg = str(err.value)
    assert needle in msg, msg
    assert err.value.hint, "every GGUFError carries a hint"
    return msg


def test_the_valid_base_file_reads(tmp_path):
    p = tmp_path / "ok.gguf"
    p.write_bytes(valid())
    h = read_header(p)
    assert list(h.tensors) == ["a.weight", "b.weight"] and h.data_offset % 32 == 0
    assert h.tensors["b.weight"].n_bytes == 32


HUGE = (1 << 64) - 1

CORPUS = [
    ("empty", b"", "too short"),
    ("bad magic", b"GGML" + valid()[4:], "bad magic"),
    ("lfs pointer", b"version https://git-lfs.github.com/spec/v1\n", "bad magic"),
    ("version 1", gguf(version=1), "version 1"),
    ("version 99", gguf(version=99), "unsupported GGUF version 99"),
    ("byte-swapped", b"GGUF" + struct.pack(">I", 3) + valid()[8:], "byte-swapped"),
    ("huge tensor count", gguf(n_tensors=HUGE), "claims 18446744073709551615 tensors"),
    ("huge kv count", gguf(n_kv=1 << 40), "key/value pairs"),
    ("more tensors than present", gguf(n_tensors=5), "name of tensor 2"),
    ("huge key length", gguf(kvs=[struct.pack("<Q", 1 << 62) + b"x"]), "over the limit"),
    ("key longer than file", gguf(kvs=[struct.pack("<Q", 5000) + b"general"]), "claims 5000 bytes"),
    ("huge string value", gguf(kvs=[s("k") + struct.pack("<IQ", 8, 1 << 50)]), "over the limit"),
    ("huge array length", gguf(kvs=[s("k") + struct.pack("<IIQ", 9, 4, 1 << 60)]), "claims 1152921504606846976"),
    ("huge string array", gguf(kvs=[s("k") + struct.pack("<IIQ", 9, 8, 1 << 40)]), "strings"),
    ("nested array", gguf(kvs=[s("k") + struct.pack("<IIQ", 9, 9, 1)]), "holds arrays"),
    ("unknown value type", gguf(kvs=[s("k") + struct.pack("<I", 13) + b"\0" * 8]), "unknown value type id 13"),
    ("unknown array item type", gguf(kvs=[s("k") + struct.pack("<IIQ", 9, 77, 1)]), "unknown value type id 77"),
    ("empty key", gguf(kvs=[s("") + struct.pack("<IB", 0, 1)]), "is empty"),
    ("duplicate key", gguf(kvs=[encode_kv("k", T.UINT8, 1), encode_kv("k", T.UINT8, 2)]), "duplicate key"),
    ("key not utf-8", gguf(kvs=[s(b"\xff\xfe") + struct.pack("<IB", 0, 1)]), "not valid UTF-8"),
    ("alignment wrong type", gguf(kvs=[encode_kv("general.alignment", T.UINT64, 32)]), "must be uint32"),
    ("alignment not power of two", gguf(kvs=[encode_kv("general.alignment", T.UINT32, 24)]), "not a power of two"),
    ("alignment zero", gguf(kvs=[encode_kv("general.alignment", T.UINT32, 0)]), "not a power of two"),
    ("alignment absurd", gguf(kvs=[encode_kv("general.alignment", T.UINT32, 1 << 31)]), "not a power of two"),
    ("huge dimension", gguf(tensors=[tinfo("a.weight", [1 << 62])]), "dimension 0 is 4611686018427387904"),
    ("negative dimension", gguf(tensors=[tinfo("a.weight", [-8])]), "dimension 0 is -8"),
    ("zero dimension", gguf(tensors=[tinfo("a.weight", [8, 0])]), "dimension 1 is 0"),
    ("overflowing shape", gguf(tensors=[tinfo("a.weight", [1 << 40, 1 << 30])]), "overflows int64"),
    ("too many dims", gguf(tensors=[tinfo("a.weight", [1, 1, 1, 1, 8])]), "5 dimensions"),
    ("n_dims huge", gguf(tensors=[tinfo("a.weight", [8], n_dims=0xFFFFFFFF)]), "4294967295 dimensions"),
    ("unknown ggml type", gguf(tensors=[tinfo("a.weight", [8], type_id=5)]), "unknown ggml type id 5"),
    ("block size", gguf(tensors=[tinfo("a.weight", [7], type_id=2)]), "not a multiple of its block size 32"),
    ("offset past EOF", gguf(tensors=[tinfo("a.weight", [8]), tinfo("b.weight", [4, 2], offset=1 << 40)]),
     "offset"),
    ("data past EOF", gguf(tensors=[tinfo("a.weight", [1 << 20])]), "past the end of the file"),
    ("misaligned offset", gguf(tensors=[tinfo("a.weight", [8]), tinfo("b.weight", [4, 2], offset=33)]),
     "not a multiple of the alignment 32"),
    ("overlapping offset", gguf(tensors=[tinfo("a.weight", [16]), tinfo("b.weight", [4, 2], offset=32)]),
     "ggml expects 64"),
    ("duplicate tensor", gguf(tensors=[tinfo("a.weight", [8]), tinfo("a.weight", [8], offset=32)]),
     "duplicate tensor name"),
    ("long tensor name", gguf(tensors=[tinfo("x" * 64, [8])]), "ggml allows 63"),
    ("tensor name not utf-8", gguf(tensors=[s(b"\xc3(") + struct.pack("<Iq", 1, 8) + struct.pack("<IQ", 0, 0)]),
     "not valid UTF-8"),
    ("no data section", gguf(data=b""), "truncated"),
]


@pytest.mark.parametrize("name, blob, needle", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_of_bad_files(tmp_path, name, blob, needle):
    expect_error(tmp_path, blob, needle)


@pytest.mark.parametrize("name, blob, needle", CORPUS[:12], ids=[c[0] for c in CORPUS[:12]])
def test_cli_reports_bad_files_without_traceback(tmp_path, capsys, name, blob, needle):
    p = tmp_path / "bad.gguf"
    p.write_bytes(blob)
    assert main(["doctor", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "hint:" in err and "Traceback" not in err


def test_truncated_at_every_header_offset(tmp_path):
    draft = write_mla_draft(tmp_path / "d.gguf", n_layer=1)
    blob = draft.read_bytes()
    h = read_header(draft)
    cuts = list(range(0, h.data_offset + 1))
    cuts += [h.data_offset + t.offset + t.n_bytes - 1 for t in h.tensors.values()]
    p = tmp_path / "cut.gguf"
    for cut in cuts:
        p.write_bytes(blob[:cut])
        with pytest.raises(GGUFError) as err:
            read_header(p)
        assert "truncated" in str(err.value) or "too short" in str(err.value) or "past the end" in str(err.value), \
            (cut, str(err.value))
    assert len(cuts) > 3000  # the whole header (tokenizer included), byte by byte


def test_wrong_value_types_are_verdicts_not_crashes(tmp_path):
    """Semantic keys with the wrong type parse fine and are reported by the checks."""
    from tests.helpers.doctor_gguf import write_mla_draft as w
    draft = w(tmp_path / "d.gguf", extra_keys={
        "dflash.embedding_length": ("wide", T.STRING),
        "dflash.block_size": (7.5, T.FLOAT32),
        "general.architecture": ("dflash", T.STRING),
    })
    _ctx, findings = run_checks(read_header(draft))
    assert exit_code(findings) == 2
    text = " ".join(f.title + f.evidence for f in findings if f.verdict == "error")
    assert "dflash.embedding_length missing or not an integer" in text
    assert "dflash.block_size = 7.5" in text


def test_reader_is_fast_on_a_file_claiming_a_huge_array(tmp_path):
    # a 1 MiB file full of zero-length strings claims 2**17 of them: read in bounded time
    n = 1 << 17
    blob = gguf(kvs=[s("k") + struct.pack("<IIQ", 9, 8, n) + b"\0" * (8 * n)], tensors=[], data=b"")
    p = tmp_path / "big.gguf"
    p.write_bytes(blob)
    h = read_header(p)
    assert len(h.get("k")) == n


# --- fuzz --------------------------------------------------------------------------------

_SEEDS: dict[str, bytes] = {}


def _seed_files(tmp_dir: Path) -> dict[str, bytes]:
    if not _SEEDS:
        _SEEDS["hand"] = valid()
        _SEEDS["draft"] = write_mla_draft(tmp_dir / "fuzz-seed.gguf", n_layer=1, n_vocab=16, n_embd=16,
                                          n_ff=16).read_bytes()
    return _SEEDS


INTERESTING = [0, 1, 7, 31, 32, 255, 1 << 31, (1 << 32) - 1, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]
mutation = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("u64"), st.integers(0, 1 << 20), st.sampled_from(INTERESTING)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 20), st.sampled_from(INTERESTING[:8])),
    st.tuples(st.just("cut"), st.integers(0, 1 << 20), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.integers(1, 16)),
)


def _mutate(blob: bytes, muts: list[tuple[str, int, int]], header_end: int) -> bytes:
    b = bytearray(blob)
    for kind, pos, val in muts:
        if not b:
            break
        # most mutations land in the header, where the parser lives
        pos = pos % (min(len(b), header_end + 64) if pos % 8 else len(b))
        if kind == "byte":
            b[pos] = val
        elif kind == "u64":
            b[pos:pos + 8] = struct.pack("<Q", val)
        elif kind == "u32":
            b[pos:pos + 4] = struct.pack("<I", val & 0xFFFFFFFF)
        elif kind == "cut":
            del b[pos:]
        elif kind == "insert":
            b[pos:pos] = bytes([val]) * 8
        elif kind == "delete":
            del b[pos:pos + val]
    return bytes(b)


FUZZ_EXAMPLES = 2000


def test_fuzz_mutated_files_never_crash(tmp_path):
    """Hypothesis mutates valid files; every outcome is a GGUFError with a hint or a verdict."""
    seeds = _seed_files(tmp_path)
    stats = {"examples": 0, "errors": 0, "verdicts": 0}
    p = tmp_path / "fuzz.gguf"

    @settings(max_examples=FUZZ_EXAMPLES, deadline=30000, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(which=st.sampled_from(["hand", "draft"]), muts=st.lists(mutation, min_size=1, max_size=4))
    def one(which, muts):
        header_end = 200 if which == "hand" else 4000
        p.write_bytes(_mutate(seeds[which], muts, header_end))
        stats["examples"] += 1
        try:
            h = read_header(p)
        except GGUFError as err:
            assert err.hint and str(err)
            stats["errors"] += 1
            return
        _ctx, findings = run_checks(h, h if which == "draft" else None)
        assert exit_code(findings) in (0, 1, 2)
        stats["verdicts"] += 1

    t0 = time.perf_counter()
    one()
    elapsed = time.perf_counter() - t0
    print(f"fuzz: {stats} in {elapsed:.1f} s")
    assert stats["examples"] >= FUZZ_EXAMPLES * 0.9, stats
    assert stats["errors"] > 50 and stats["verdicts"] > 50, stats


# semantic fuzz: valid GGUF framing, hostile values (wrong types, absurd numbers) in the keys
# the checks read; written through the same rewrite path --fix-metadata uses
VALUE = st.one_of(
    st.tuples(st.just(T.UINT32), st.integers(0, (1 << 32) - 1), st.none()),
    st.tuples(st.just(T.INT32), st.integers(-(1 << 31), (1 << 31) - 1), st.none()),
    st.tuples(st.just(T.UINT64), st.integers(0, (1 << 64) - 1), st.none()),
    st.tuples(st.just(T.FLOAT32), st.floats(width=32, allow_nan=True), st.none()),
    st.tuples(st.just(T.BOOL), st.booleans(), st.none()),
    st.tuples(st.just(T.STRING), st.text(max_size=8), st.none()),
    st.tuples(st.just(T.ARRAY), st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=8), st.just(T.INT32)),
    st.tuples(st.just(T.ARRAY), st.lists(st.text(max_size=4), max_size=4), st.just(T.STRING)),
)
SEMANTIC_KEYS = [
    "general.architecture", "dflash.embedding_length", "dflash.block_count", "dflash.feed_forward_length",
    "dflash.attention.head_count", "dflash.attention.head_count_kv", "dflash.attention.key_length",
    "dflash.attention.value_length", "dflash.attention.key_length_mla", "dflash.attention.value_length_mla",
    "dflash.attention.q_lora_rank", "dflash.attention.kv_lora_rank", "dflash.rope.dimension_count",
    "dflash.rope.freq_base", "dflash.rope.scaling.type", "dflash.rope.scaling.factor",
    "dflash.rope.scaling.yarn_log_multiplier", "dflash.rope.scaling.original_context_length",
    "dflash.attention.scale", "dflash.target_layers", "dflash.block_size", "dflash.hyper_connection.count",
    "tokenizer.ggml.mask_token_id", "tokenizer.ggml.tokens", "tokenizer.ggml.model", "kimi-k3.block_count",
]
SEMANTIC_EXAMPLES = 400


def test_fuzz_hostile_values_give_verdicts(tmp_path):
    from llamacpp_mla_port.gguf.header import rewrite_metadata
    src = read_header(write_mla_draft(tmp_path / "d.gguf", n_layer=1, n_vocab=16, n_embd=16, n_ff=16))
    stats = {"examples": 0, "verdicts": {0: 0, 1: 0, 2: 0}}
    out = tmp_path / "o.gguf"

    @settings(max_examples=SEMANTIC_EXAMPLES, deadline=30000, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(changes=st.dictionaries(st.sampled_from(SEMANTIC_KEYS), VALUE, min_size=1, max_size=4))
    def one(changes):
        rewrite_metadata(src, out, changes)
        h = read_header(out)   # valid framing: must parse
        _ctx, findings = run_checks(h)
        stats["examples"] += 1
        stats["verdicts"][exit_code(findings)] += 1
        _ctx, findings = run_checks(h, h)   # the same file as its own "target": every target check runs
        assert exit_code(findings) == 2

    one()
    print(f"semantic fuzz: {stats}")
    assert stats["examples"] >= SEMANTIC_EXAMPLES * 0.9
    assert stats["verdicts"][2] > 0

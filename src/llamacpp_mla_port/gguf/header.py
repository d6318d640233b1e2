"""A bounded GGUF header reader (and header rewriter) for files nobody vouched for.

`gguf.GGUFReader` trusts the counts it reads and memory-maps the file: a 100-byte file
that claims 2**60 key/value pairs or a tensor 2**62 elements wide makes it allocate, loop
for ever or fail with an IndexError deep inside numpy. GGUF parsing has a long CVE
history of exactly that (overflowing counts and dimensions, alignment overflow, zero
dimensions, tiny files asking for huge allocations), so `doctor` reads the header here:

- every read is checked against the bytes left in the file before anything is
  allocated, so no allocation is larger than the file itself;
- every count (keys, tensors, array lengths, string lengths, dimensions) is checked
  against what the remaining bytes could possibly hold and against fixed limits;
- tensor types, dimensions, byte sizes, alignment and offsets follow the rules of
  ggml's own loader (ggml/src/gguf.cpp at the pinned base), including the rule that
  tensor data is laid out in order with alignment padding;
- anything wrong raises `errors.GGUFError` with the offset, what was expected and a hint.

The value-type and tensor-type tables come from the `gguf` package; only the parsing
and the limits are ours. Tensor data is never read here: `tensor_rows` gives bounded,
chunked access to one validated tensor when a check needs it.

`rewrite_metadata` writes a copy with some keys replaced: the other key/value records
and the tensor-info records are copied byte for byte, the data section is streamed.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys

from llamacpp_mla_port.errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Limits. ggml's own loader allows 2**30 array elements and 1 GiB strings; we only need
# headers of drafts and targets, whose largest arrays are vocabularies (~260k entries).
MAX_KEY_LENGTH = 65535            # GGUF spec: keys are at most 65535 bytes
MAX_TENSOR_NAME = 63              # ggml: GGML_MAX_NAME is 64 including the NUL
MAX_STRING_VALUE = 16 << 20       # one metadata string (chat templates are ~10-50 KiB)
MAX_ARRAY_ELEMENTS = 1 << 24      # numeric metadata arrays
MAX_STRING_ARRAY = 1 << 22        # string arrays (vocabularies, merges)
MAX_TENSORS = 1 << 20
MAX_KVS = 1 << 20
MAX_DIMS = 4                      # ggml: GGML_MAX_DIMS
MAX_DIM = 1 << 40                 # one dimension; larger is a crafted file
MAX_ALIGNMENT = 1 << 20
INT64_MAX = (1 << 63) - 1

_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# the same little-endian layouts as numpy dtypes, for whole arrays
_NUMPY_DTYPES: dict[GGUFValueType, np.dtype] = {t: np.dtype(f) for t, f in _SCALAR_FORMATS.items()}

# (block size, bytes per block) per ggml type id: the PyPI gguf table plus the types the
# pinned tree added after gguf 0.19 (gguf-py/gguf/constants.py at the base).
QUANT_SIZES: dict[int, tuple[int, int]] = {int(k): v for k, v in GGML_QUANT_SIZES.items()}
QUANT_SIZES.setdefault(42, (64, 2 + 16))  # Q2_0
TYPE_NAMES: dict[int, str] = {int(t): t.name for t in GGMLQuantizationType}
TYPE_NAMES.setdefault(42, "Q2_0")

INTEGER_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})


@dataclass(frozen=True)
class KV:
    """One metadata record. `span` is its byte range in the file (key included)."""

    key: str
    type: GGUFValueType
    value: Any                      # scalar, str, list (numbers or str)
    item_type: GGUFValueType | None = None  # for arrays
    span: tuple[int, int] = (0, 0)
    value_span: tuple[int, int] = (0, 0)

    @property
    def type_name(self) -> str:
        if self.type == GGUFValueType.ARRAY and self.item_type is not None:
            return f"array[{self.item_type.name.lower()}]"
        return self.type.name.lower()

    def is_int(self) -> bool:
        return self.type in INTEGER_TYPES

    def is_number(self) -> bool:
        return self.type in INTEGER_TYPES or self.type in FLOAT_TYPES

    def is_int_array(self) -> bool:
        return self.type == GGUFValueType.ARRAY and self.item_type in INTEGER_TYPES


@dataclass(frozen=True)
class TensorInfo:
    """One tensor-info record. `shape` is in ggml order (ne0 first: the input width)."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int                     # relative to the data section
    n_bytes: int
    span: tuple[int, int] = (0, 0)

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type_id, str(self.type_id))

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass
class GGUFHeader:
    path: Path
    file_size: int
    version: int
    alignment: int
    kvs: dict[str, KV]
    tensors: dict[str, TensorInfo]
    tensor_info_end: int            # end of the last tensor-info record
    data_offset: int                # start of the data section (aligned)
    kv_region: tuple[int, int] = (0, 0)
    tensor_region: tuple[int, int] = (0, 0)
    _hashes: dict[str, str] = field(default_factory=dict)

    @property
    def arch(self) -> str | None:
        kv = self.kvs.get(Keys.General.ARCHITECTURE)
        return kv.value if kv is not None and kv.type == GGUFValueType.STRING else None

    def get(self, key: str, default: Any = None) -> Any:
        kv = self.kvs.get(key)
        return default if kv is None else kv.value

    def value_sha256(self, key: str) -> str | None:
        """sha256 of a record's raw value bytes (read in chunks, bounded by the file)."""
        kv = self.kvs.get(key)
        if kv is None:
            return None
        if key not in self._hashes:
            start, end = kv.value_span
            h = hashlib.sha256()
            with open(self.path, "rb") as f:
                f.seek(start)
                left = end - start
                while left > 0:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        raise GGUFError(f"{self.path}: file shrank while reading {key!r}",
                                        "is another process writing it?")
                    h.update(chunk)
                    left -= len(chunk)
            self._hashes[key] = h.hexdigest()
        return self._hashes[key]


class _Cursor:
    """Sequential reads that never go past the end of the file."""

    def __init__(self, f: BinaryIO, size: int, path: Path):
        self.f = f
        self.size = size
        self.pos = 0
        self.path = path

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def fail(self, message: str, hint: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}", hint)

    def read(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.remaining:
            raise self.fail(
                f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"only {self.remaining} left (file is {self.size} bytes)",
                "the download or conversion was cut short: fetch the file again "
                "and compare its size/sha256 with the published one")
        data = self.f.read(n)
        if len(data) != n:
            raise self.fail(f"short read at offset {self.pos} ({what})", "is another process writing the file?")
        self.pos += n
        return data

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str, limit: int) -> bytes:
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > limit:
            raise self.fail(f"{what} at offset {at} claims {n} bytes, over the limit of {limit}",
                            "a crafted or corrupted header: do not load this file")
        if n > self.remaining:
            raise self.fail(
                f"truncated: {what} at offset {at} claims {n} bytes, only "
                f"{self.remaining} left (file is {self.size} bytes)",
                "the file is cut short or its header is corrupted: fetch it again")
        return self.read(n, what)


def _decode(raw: bytes, what: str, cur: _Cursor) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise cur.fail(f"{what} is not valid UTF-8 ({err.reason} at byte {err.start})",
                       "a corrupted or crafted header: do not load this file") from None


def _value_type(raw: int, what: str, cur: _Cursor) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"{what} has unknown value type id {raw} (valid: 0-12)",
                       "a corrupted header or a GGUF extension this tool does not know") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str) -> tuple[Any, GGUFValueType | None]:
    if vtype == GGUFValueType.STRING:
        raw = cur.string(f"string value of {key!r}", MAX_STRING_VALUE)
        return raw.decode("utf-8", errors="replace"), None
    if vtype in _SCALAR_FORMATS:
        v = cur.scalar(_SCALAR_FORMATS[vtype], f"value of {key!r}")
        return (bool(v) if vtype == GGUFValueType.BOOL else v), None
    # array
    at = cur.pos
    itype = _value_type(cur.u32(f"item type of {key!r}"), f"array {key!r}", cur)
    n = cur.u64(f"length of array {key!r}")
    if itype == GGUFValueType.ARRAY:
        raise cur.fail(f"array {key!r} at offset {at} holds arrays",
                       "ggml's loader rejects nested arrays; this file cannot load")
    if itype == GGUFValueType.STRING:
        if n > MAX_STRING_ARRAY or n * 8 > cur.remaining:
            raise cur.fail(
                f"array {key!r} at offset {at} claims {n} strings; the {cur.remaining} "
                f"bytes left hold at most {cur.remaining // 8}"
                + (f" and this reader stops at {MAX_STRING_ARRAY}" if n > MAX_STRING_ARRAY else ""),
                "a truncated or crafted header: do not load this file")
        items = []
        for i in range(n):
            raw = cur.string(f"string {i} of {key!r}", MAX_STRING_VALUE)
            items.append(raw.decode("utf-8", errors="replace"))
        return items, itype
    size = struct.calcsize(_SCALAR_FORMATS[itype])
    if n > MAX_ARRAY_ELEMENTS or n * size > cur.remaining:
        raise cur.fail(
            f"array {key!r} at offset {at} claims {n} x {itype.name.lower()} "
            f"({n * size} bytes); {cur.remaining} bytes are left"
            + (f" and this reader stops at {MAX_ARRAY_ELEMENTS} elements" if n > MAX_ARRAY_ELEMENTS else ""),
            "a truncated or crafted header: do not load this file")
    arr = np.frombuffer(cur.read(n * size, f"array {key!r}"), dtype=_NUMPY_DTYPES[itype])
    values = arr.astype(bool).tolist() if itype == GGUFValueType.BOOL else arr.tolist()
    return values, itype


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse and validate the header of a GGUF file; never reads tensor data."""
    path = Path(path)
    try:
        size = path.stat().st_size
        f = open(path, "rb", buffering=1 << 20)
    except OSError as err:
        raise GGUFError(f"cannot open {path}: {err.strerror}", "check the path and permissions") from None
    if not path.is_file():
        f.close()
        raise GGUFError(f"{path} is not a regular file", "pass the path of a .gguf file")
    with f:
        return _parse(_Cursor(f, size, path))


def _parse(cur: _Cursor) -> GGUFHeader:
    magic = cur.read(4, "magic") if cur.size >= 4 else None
    if magic is None:
        raise cur.fail(f"only {cur.size} bytes: too short to be a GGUF file",
                       "the download is empty or cut short: fetch it again")
    if magic != GGUF_MAGIC:
        raise cur.fail(f"bad magic {magic!r}, expected b'GGUF'",
                       "not a GGUF file (a safetensors/PyTorch checkpoint, an HTML error "
                       "page or a Git LFS pointer?): convert it or fetch the real file")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and version != 0:
            raise cur.fail(f"version field {version:#x} looks byte-swapped",
                           "a big-endian GGUF: convert it to little-endian first")
        if version == 1:
            raise cur.fail("GGUF version 1 is no longer supported by llama.cpp",
                           "reconvert the model with a current converter")
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)",
                       "a corrupted header or a newer format than this tool knows")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("key/value count")
    # smallest records: tensor info = 8 (name len) + 1 + 4 (n_dims) + 4 (type) + 8 (offset);
    # key/value = 8 (key len) + 1 + 4 (type) + 1 (value)
    min_ti, min_kv = 25, 14
    if n_kv > MAX_KVS or n_kv * min_kv > cur.remaining:
        raise cur.fail(f"header claims {n_kv} key/value pairs; the {cur.remaining} bytes left "
                       f"hold at most {cur.remaining // min_kv}",
                       "a truncated or crafted header: do not load this file")
    if n_tensors > MAX_TENSORS or n_tensors * min_ti + n_kv * min_kv > cur.remaining:
        raise cur.fail(f"header claims {n_tensors} tensors; the {cur.remaining} bytes left "
                       f"hold at most {max(0, cur.remaining - n_kv * min_kv) // min_ti}",
                       "a truncated or crafted header: do not load this file")

    kvs: dict[str, KV] = {}
    kv_start = cur.pos
    for i in range(n_kv):
        start = cur.pos
        key = _decode(cur.string(f"key {i}", MAX_KEY_LENGTH), f"key {i}", cur)
        if not key:
            raise cur.fail(f"key {i} at offset {start} is empty", "a corrupted header")
        if key in kvs:
            raise cur.fail(f"duplicate key {key!r} at offset {start}",
                           "ggml's loader rejects duplicate keys; rewrite the metadata")
        vtype = _value_type(cur.u32(f"type of {key!r}"), f"key {key!r}", cur)
        vstart = cur.pos
        value, itype = _read_value(cur, vtype, key)
        kvs[key] = KV(key, vtype, value, itype, (start, cur.pos), (vstart, cur.pos))
    kv_end = cur.pos

    alignment = DEFAULT_ALIGNMENT
    if Keys.General.ALIGNMENT in kvs:
        kv = kvs[Keys.General.ALIGNMENT]
        if kv.type != GGUFValueType.UINT32:
            raise cur.fail(f"general.alignment is {kv.type_name}, must be uint32",
                           "ggml's loader rejects this file; rewrite the metadata")
        alignment = kv.value
        if alignment == 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
            raise cur.fail(f"general.alignment = {alignment} is not a power of two in [1, {MAX_ALIGNMENT}]",
                           "a corrupted or crafted header: do not load this file")

    tensors: dict[str, TensorInfo] = {}
    for i in range(n_tensors):
        start = cur.pos
        name = _decode(cur.string(f"name of tensor {i}", MAX_KEY_LENGTH), f"name of tensor {i}", cur)
        if len(name.encode()) > MAX_TENSOR_NAME:
            raise cur.fail(f"tensor {i} name {name[:80]!r} is {len(name.encode())} bytes, "
                           f"ggml allows {MAX_TENSOR_NAME}", "ggml's loader rejects this file")
        if name in tensors:
            raise cur.fail(f"duplicate tensor name {name!r} at offset {start}",
                           "ggml's loader rejects duplicate tensors")
        n_dims = cur.u32(f"n_dims of {name!r}")
        if n_dims > MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions, ggml allows {MAX_DIMS}",
                           "a corrupted or crafted header: do not load this file")
        shape = tuple(struct.unpack(f"<{n_dims}q", cur.read(8 * n_dims, f"dims of {name!r}")))
        for j, d in enumerate(shape):
            if d <= 0 or d > MAX_DIM:
                raise cur.fail(f"tensor {name!r} dimension {j} is {d}; it must be in [1, {MAX_DIM}]",
                               "a corrupted or crafted header (zero or absurd dimension): do not load this file")
        n_el = 1
        for d in shape:
            if n_el > INT64_MAX // d:
                raise cur.fail(f"tensor {name!r} shape {list(shape)} overflows int64",
                               "a crafted header: do not load this file")
            n_el *= d
        type_id = cur.u32(f"type of {name!r}")
        if type_id not in QUANT_SIZES:
            raise cur.fail(f"tensor {name!r} has unknown ggml type id {type_id}",
                           "a corrupted header, or a type newer than the pinned llama.cpp")
        blck, tsize = QUANT_SIZES[type_id]
        ne0 = shape[0] if shape else 1
        if ne0 % blck:
            raise cur.fail(f"tensor {name!r} ({TYPE_NAMES.get(type_id)}) has {ne0} elements per row, "
                           f"not a multiple of its block size {blck}", "ggml's loader rejects this file")
        n_bytes = n_el // blck * tsize
        offset = cur.u64(f"data offset of {name!r}")
        tensors[name] = TensorInfo(name, shape, type_id, offset, n_bytes, (start, cur.pos))
    ti_end = cur.pos

    data_offset = ti_end + (-ti_end % alignment)
    if n_tensors and data_offset > cur.size:
        raise cur.fail(f"truncated: data section would start at {data_offset}, file is {cur.size} bytes",
                       "the file is cut short: fetch it again")
    # ggml lays tensors out in order, each padded to the alignment; it rejects anything else
    expected = 0
    for t in tensors.values():
        if t.offset % alignment:
            raise cur.fail(f"tensor {t.name!r} offset {t.offset} is not a multiple of the alignment {alignment}",
                           "a corrupted header: ggml's loader rejects this file")
        if t.offset != expected:
            raise cur.fail(f"tensor {t.name!r} has data offset {t.offset}, ggml expects {expected} "
                           "(tensors must follow each other in order)",
                           "a corrupted or hand-edited header: ggml's loader rejects this file")
        end = data_offset + t.offset + t.n_bytes
        if end > cur.size:
            raise cur.fail(f"tensor {t.name!r} data ends at byte {end}, past the end of the file ({cur.size} bytes)",
                           "the file is truncated (or its header lies): fetch it again")
        expected += t.n_bytes + (-t.n_bytes % alignment)
    return GGUFHeader(cur.path, cur.size, version, alignment, kvs, tensors, ti_end, data_offset,
                      (kv_start, kv_end), (kv_end, ti_end))


# --- tensor data, only for checks that need it ---------------------------------------

def tensor_rows(header: GGUFHeader, name: str, rows_per_chunk: int = 1024) -> Iterator[np.ndarray]:
    """Yield float32 blocks of rows (ne0 wide) of an F32/F16/BF16 tensor, bounded in memory."""
    t = header.tensors[name]
    dtypes = {0: "<f4", 1: "<f2", 30: "<u2"}
    if t.type_id not in dtypes:
        raise GGUFError(f"{header.path}: tensor {name!r} is {t.type_name}; only F32/F16/BF16 can be compared",
                        "compare unquantized files (convert with --outtype bf16 or f32)")
    width = t.shape[0] if t.shape else 1
    n_rows = t.n_elements // width
    itemsize = 4 if t.type_id == 0 else 2
    rows_per_chunk = max(1, min(rows_per_chunk, (64 << 20) // max(1, width * itemsize)))
    with open(header.path, "rb") as f:
        f.seek(header.data_offset + t.offset)
        done = 0
        while done < n_rows:
            k = min(rows_per_chunk, n_rows - done)
            raw = f.read(k * width * itemsize)
            if len(raw) != k * width * itemsize:
                raise GGUFError(f"{header.path}: short read in tensor {name!r}", "the file changed or is truncated")
            arr = np.frombuffer(raw, dtype=dtypes[t.type_id])
            if t.type_id == 30:
                arr = (arr.astype(np.uint32) << 16).view(np.float32)
            yield arr.astype(np.float32).reshape(k, width)
            done += k


# --- writing a corrected copy ---------------------------------------------------------

def encode_kv(key: str, vtype: GGUFValueType, value: Any, item_type: GGUFValueType | None = None) -> bytes:
    """Serialise one key/value record (GGUF v3, little-endian)."""
    kb = key.encode("utf-8")
    return struct.pack("<Q", len(kb)) + kb + struct.pack("<I", int(vtype)) + _encode_value(vtype, value, item_type)


def _encode_value(vtype: GGUFValueType, value: Any, item_type: GGUFValueType | None) -> bytes:
    if vtype == GGUFValueType.STRING:
        b = str(value).encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    if vtype in _SCALAR_FORMATS:
        return struct.pack(_SCALAR_FORMATS[vtype], int(value) if vtype == GGUFValueType.BOOL else value)
    if vtype == GGUFValueType.ARRAY and item_type is not None and item_type != GGUFValueType.ARRAY:
        parts = [struct.pack("<IQ", int(item_type), len(value))]
        parts += [_encode_value(item_type, v, None) for v in value]
        return b"".join(parts)
    raise ValueError(f"cannot encode {vtype!r}/{item_type!r}")


def rewrite_metadata(src: GGUFHeader, out: Path,
                     changes: dict[str, tuple[GGUFValueType, Any, GGUFValueType | None]]) -> None:
    """Write `out`: `src` with the keys in `changes` set (added or replaced).

    Untouched records are copied byte for byte; the data section is streamed in 4 MiB
    chunks. Writes to a temporary name first so a failure never leaves a half file.
    """
    out = Path(out)
    with open(src.path, "rb") as f:
        def raw(span: tuple[int, int]) -> bytes:
            f.seek(span[0])
            return f.read(span[1] - span[0])
        records = [encode_kv(key, *changes[key]) if key in changes else raw(kv.span) for key, kv in src.kvs.items()]
        records += [encode_kv(key, *change) for key, change in changes.items() if key not in src.kvs]
        tensor_infos = raw(src.tensor_region)

        header = b"".join([GGUF_MAGIC, struct.pack("<IQQ", 3, len(src.tensors), len(records)), *records, tensor_infos])
        header += b"\0" * (-len(header) % src.alignment)
        tmp = out.with_name(out.name + ".part")
        try:
            with open(tmp, "wb") as o:
                o.write(header)
                if src.tensors:
                    f.seek(src.data_offset)
                    while chunk := f.read(4 << 20):
                        o.write(chunk)
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

"""Tensor payloads on the wire: state dicts <-> bytes, manifests, chunks (no node, no ROS graph).

Performance rule (issue 2): a message is never filled through the generated public
array setter with an ndarray, which iterates element by element (about 1.6 s for
21.5 MB). Payload bytes are packed once into one contiguous uint8 buffer (one pass over
the tensors), chunk messages hold zero-copy memoryviews of that buffer in their private
``_data`` field (rclpy's C conversion accepts any buffer-protocol object there and does
the one unavoidable memcpy into the DDS sample), and received bytes are read with
``np.frombuffer`` over the message's ``array.array`` (zero copy).
"""

from __future__ import annotations

import array
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fed_ros.core import quantized_deltas, sparse_deltas
from fed_ros.core.compression import block_nbytes, decode_block_tensor, encode_block_tensor
from fed_ros.core.params import Manifest, TensorSpec, manifest_of
from fed_ros.msg import TensorPayload, TensorSpec as TensorSpecMsg

StateDict = dict[str, np.ndarray]

# Encoding names <-> TensorPayload.ENCODING_* constants.
ENCODINGS: dict[str, int] = {
    "float32": TensorPayload.ENCODING_FLOAT32,
    "float16": TensorPayload.ENCODING_FLOAT16,
    "int8": TensorPayload.ENCODING_INT8,
    "int8_block": TensorPayload.ENCODING_INT8_BLOCK,
    "topk": TensorPayload.ENCODING_TOPK,
    "int4_block": TensorPayload.ENCODING_INT4_BLOCK,
    "int8_delta": TensorPayload.ENCODING_INT8_DELTA,
    "int4_delta": TensorPayload.ENCODING_INT4_DELTA,
}
ENCODING_NAMES: dict[int, str] = {v: k for k, v in ENCODINGS.items()}
# Bytes per element on the wire, per encoding (little-endian, no padding).
_WIRE_DTYPE: dict[int, np.dtype] = {
    TensorPayload.ENCODING_FLOAT32: np.dtype("<f4"),
    TensorPayload.ENCODING_FLOAT16: np.dtype("<f2"),
    TensorPayload.ENCODING_INT8: np.dtype("i1"),
    TensorPayload.ENCODING_INT8_BLOCK: np.dtype("i1"),  # plus its block scales (tensor_nbytes)
    TensorPayload.ENCODING_TOPK: np.dtype("<f4"),  # values; plus count and indices (sparse_deltas)
    TensorPayload.ENCODING_INT4_BLOCK: np.dtype("u1"),  # two values a byte, plus block scales
    TensorPayload.ENCODING_INT8_DELTA: np.dtype("u1"),  # a zlib stream (quantized_deltas)
    TensorPayload.ENCODING_INT4_DELTA: np.dtype("u1"),  # a zlib stream (quantized_deltas)
}
# The deflated, quantized delta encodings (updates only; sizes depend on the values).
_QUANTIZED_DELTAS = {
    TensorPayload.ENCODING_INT8_DELTA: "int8_delta",
    TensorPayload.ENCODING_INT4_DELTA: "int4_delta",
}
# The blockwise encodings (block scales inside the payload: fed_ros.core.compression).
_BLOCKWISE = {
    TensorPayload.ENCODING_INT8_BLOCK: "int8_block",
    TensorPayload.ENCODING_INT4_BLOCK: "int4_block",
}
_FLOAT16_MAX = float(np.finfo(np.float16).max)
# Model dtypes a manifest may name (core state dicts are float32; see core/params.py).
MODEL_DTYPES = frozenset({"float32"})


# --------------------------------------------------------------------------- bytes


def set_bytes_field(msg: Any, name: str, data: Any) -> None:
    """Assign bytes-like ``data`` to a uint8[] field without the element-wise setter.

    ``data`` may be bytes, bytearray, memoryview, array.array('B') or a C-contiguous
    ndarray; it is stored as a flat uint8 memoryview (zero copy). rclpy's generated C
    conversion reads it through the buffer protocol (one memcpy at publish time).
    """
    private = "_" + name
    if private not in getattr(type(msg), "__slots__", ()):
        raise ValueError(f"message {type(msg).__name__} has no field {name!r}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError(f"field {name!r}: data must be C-contiguous")
    setattr(msg, private, view.cast("B") if view.format != "B" or view.ndim != 1 else view)


def set_float32_field(msg: Any, name: str, values: Any) -> None:
    """Assign a float32 array to a float32[] field in one copy (no element-wise setter)."""
    private = "_" + name
    if private not in getattr(type(msg), "__slots__", ()):
        raise ValueError(f"message {type(msg).__name__} has no field {name!r}")
    arr = np.ascontiguousarray(values, dtype=np.float32).ravel()
    out = array.array("f")
    out.frombytes(memoryview(arr).cast("B"))
    setattr(msg, private, out)


def bytes_view(data: Any) -> np.ndarray:
    """Zero-copy uint8 view of a received uint8[] field (array.array, bytes, memoryview)."""
    if len(data) == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def sha256_hex(data: Any) -> str:
    """Lower-case hex SHA-256 of a bytes-like object (no copy)."""
    return hashlib.sha256(memoryview(data)).hexdigest()


# ----------------------------------------------------------------------- manifests


def manifest_to_msgs(manifest: Sequence[TensorSpec]) -> list[TensorSpecMsg]:
    """Core manifest -> list of fed_ros/TensorSpec messages."""
    return [
        TensorSpecMsg(name=s.name, shape=[int(d) for d in s.shape], dtype=s.dtype) for s in manifest
    ]


def manifest_from_msgs(specs: Sequence[TensorSpecMsg]) -> Manifest:
    """fed_ros/TensorSpec messages -> core manifest (validated: names unique, float dtypes)."""
    out: list[TensorSpec] = []
    seen: set[str] = set()
    for spec in specs:
        name = str(spec.name)
        if not name:
            raise ValueError("manifest: empty tensor name")
        if name in seen:
            raise ValueError(f"manifest: duplicate tensor name {name!r}")
        if spec.dtype not in MODEL_DTYPES:
            raise ValueError(f"manifest: tensor {name!r} has unsupported dtype {spec.dtype!r}")
        seen.add(name)
        # TensorSpec validates the rest (shape) and raises ValueError naming the tensor.
        out.append(
            TensorSpec(name=name, shape=tuple(int(d) for d in spec.shape), dtype=str(spec.dtype))
        )
    return tuple(out)


def _numel(shape: Sequence[int]) -> int:
    # Python ints: an adversarial shape cannot overflow into a small allocation.
    return math.prod(int(d) for d in shape)


def tensor_nbytes(n: int, encoding: int) -> int:
    """Payload bytes of one tensor of ``n`` values under ``encoding``."""
    if encoding in _BLOCKWISE:
        return block_nbytes(n, _BLOCKWISE[encoding])
    return n * _WIRE_DTYPE[encoding].itemsize


def encoded_size(manifest: Sequence[TensorSpec], encoding: int) -> int:
    """Number of payload bytes the manifest implies under a dense ``encoding`` (a topk
    payload's size depends on the sender's fraction: see :func:`size_range`)."""
    if encoding not in _WIRE_DTYPE:
        raise ValueError(f"unknown payload encoding {encoding!r}")
    if encoding == TensorPayload.ENCODING_TOPK or encoding in _QUANTIZED_DELTAS:
        raise ValueError(f"a {ENCODING_NAMES[encoding]} payload has no fixed size; use size_range")
    return sum(tensor_nbytes(_numel(s.shape), encoding) for s in manifest)


def size_range(manifest: Sequence[TensorSpec], encoding: int) -> tuple[int, int]:
    """(smallest, largest) payload bytes the manifest allows under ``encoding``: one size for
    the dense encodings; for topk, from no entry to every entry kept (decoding checks the rest)."""
    if encoding == TensorPayload.ENCODING_TOPK:
        return sparse_deltas.payload_bounds([_numel(s.shape) for s in manifest])
    if encoding in _QUANTIZED_DELTAS:
        sizes = [_numel(s.shape) for s in manifest]
        return quantized_deltas.payload_bounds(sizes, _QUANTIZED_DELTAS[encoding])
    size = encoded_size(manifest, encoding)
    return size, size


def _encoding_id(encoding: int | str) -> int:
    if isinstance(encoding, str):
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; expected one of {sorted(ENCODINGS)}")
        return ENCODINGS[encoding]
    if encoding not in _WIRE_DTYPE:
        raise ValueError(f"unknown payload encoding {encoding!r}")
    return int(encoding)


# ------------------------------------------------------------------ encode / decode


@dataclass(frozen=True)
class EncodedPayload:
    """A state dict packed into one contiguous uint8 buffer (payload order = manifest order)."""

    manifest: Manifest
    encoding: int
    scales: np.ndarray  # float32 (len(manifest),) for int8, empty otherwise
    data: np.ndarray  # uint8 (total_bytes,), C-contiguous
    sha256: str = field(default="")

    @property
    def total_bytes(self) -> int:
        """Size of the encoded payload in bytes."""
        return int(self.data.nbytes)


def encode_state_dict(
    sd: Mapping[str, np.ndarray],
    encoding: int | str = "float32",
    topk_fraction: float = sparse_deltas.DEFAULT_FRACTION,
) -> EncodedPayload:
    """Pack a state dict into one buffer (one pass over the tensors) and hash it.

    Under ``topk``, ``sd`` is a delta (what to add to the start model) and ``topk_fraction`` of
    each tensor's entries travel; under ``int8_delta``/``int4_delta`` it is a delta too, all of
    it quantized and deflated."""
    enc = _encoding_id(encoding)
    wire = _WIRE_DTYPE[enc]
    specs = manifest_of(sd)  # validates: ndarray, float32, non-empty unique names
    if enc == TensorPayload.ENCODING_TOPK or enc in _QUANTIZED_DELTAS:
        if enc == TensorPayload.ENCODING_TOPK:
            packed = b"".join(
                sparse_deltas.encode_tensor(v, topk_fraction, k) for k, v in sd.items()
            )
        else:
            packed = quantized_deltas.encode_payload(sd, _QUANTIZED_DELTAS[enc])
        data = np.frombuffer(packed, dtype=np.uint8).copy()
        return EncodedPayload(
            manifest=tuple(specs),
            encoding=enc,
            scales=np.zeros(0, np.float32),
            data=data,
            sha256=sha256_hex(data),
        )
    total = encoded_size(specs, enc)
    data = np.empty(total, dtype=np.uint8)
    scales = np.zeros(len(specs) if enc == TensorPayload.ENCODING_INT8 else 0, dtype=np.float32)
    offset = 0
    for i, (name, value) in enumerate(sd.items()):
        arr = np.asarray(value)
        n = arr.size
        if enc in _BLOCKWISE:
            packed = encode_block_tensor(arr, _BLOCKWISE[enc], name)
            data[offset : offset + len(packed)] = np.frombuffer(packed, np.uint8)
            offset += len(packed)
            continue
        dest = data[offset : offset + n * wire.itemsize].view(wire)
        if enc == TensorPayload.ENCODING_INT8:
            peak = float(np.max(np.abs(arr))) if n else 0.0
            if not math.isfinite(peak):
                raise ValueError(
                    f"tensor {name!r} is not finite; int8 encoding needs finite values"
                )
            scale = peak / 127.0 if peak > 0 else 1.0
            scales[i] = scale
            np.clip(np.rint(arr.reshape(-1) / scale), -127, 127, out=dest, casting="unsafe")
        else:
            if (
                enc == TensorPayload.ENCODING_FLOAT16
                and n
                and float(np.max(np.abs(arr))) > _FLOAT16_MAX
            ):
                # float16 would turn these into inf silently; the server rejects non-finite updates.
                raise ValueError(
                    f"tensor {name!r} exceeds the float16 range (|x| > {_FLOAT16_MAX})"
                )
            # Writes straight into the payload buffer: the only copy of the tensor bytes.
            np.copyto(dest, arr.reshape(-1), casting="same_kind")
        offset += n * wire.itemsize
    return EncodedPayload(
        manifest=tuple(specs), encoding=enc, scales=scales, data=data, sha256=sha256_hex(data)
    )


def decode_state_dict(
    manifest: Sequence[TensorSpec],
    encoding: int | str,
    data: Any,
    scales: Sequence[float] | np.ndarray = (),
    copy: bool = False,
) -> StateDict:
    """Unpack payload bytes into a state dict; float32 tensors are zero-copy views unless
    ``copy``."""
    enc = _encoding_id(encoding)
    wire = _WIRE_DTYPE[enc]
    buf = bytes_view(data) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    lo, hi = size_range(manifest, enc)
    if not lo <= buf.nbytes <= hi:
        raise ValueError(
            f"payload has {buf.nbytes} bytes; manifest and encoding "
            f"{ENCODING_NAMES[enc]} imply {lo if lo == hi else f'{lo}..{hi}'}"
        )
    if enc == TensorPayload.ENCODING_TOPK:  # a dense delta per tensor (zeros where none sent)
        dense = sparse_deltas.decode_payload(
            buf, [_numel(s.shape) for s in manifest], [s.name for s in manifest]
        )
        return {s.name: v.astype(s.dtype).reshape(s.shape) for s, v in zip(manifest, dense)}
    if enc in _QUANTIZED_DELTAS:
        dense = quantized_deltas.decode_payload(
            buf,
            [_numel(s.shape) for s in manifest],
            [s.name for s in manifest],
            _QUANTIZED_DELTAS[enc],
        )
        return {s.name: v.astype(s.dtype).reshape(s.shape) for s, v in zip(manifest, dense)}
    scale_arr = np.asarray(scales, dtype=np.float32).reshape(-1)
    if enc == TensorPayload.ENCODING_INT8:
        if scale_arr.size != len(manifest):
            raise ValueError(f"int8 payload needs {len(manifest)} scales, got {scale_arr.size}")
        if not np.all(np.isfinite(scale_arr)):
            raise ValueError("int8 payload has non-finite scales")
    out: StateDict = {}
    offset = 0
    for i, spec in enumerate(manifest):
        n = _numel(spec.shape)
        if enc in _BLOCKWISE:
            size = block_nbytes(n, _BLOCKWISE[enc])
            part = buf[offset : offset + size]
            offset += size
            try:
                value = decode_block_tensor(part, n, _BLOCKWISE[enc])
            except ValueError as err:
                raise ValueError(f"tensor {spec.name!r}: {err}") from None
            out[spec.name] = value.astype(spec.dtype).reshape(spec.shape)
            continue
        raw = buf[offset : offset + n * wire.itemsize].view(wire)
        offset += n * wire.itemsize
        if enc == TensorPayload.ENCODING_INT8:
            value = raw.astype(spec.dtype) * np.asarray(scale_arr[i], dtype=spec.dtype)
        elif raw.dtype == np.dtype(spec.dtype) and not copy:
            value = raw  # zero copy over the received buffer
        else:
            value = raw.astype(spec.dtype)
        out[spec.name] = value.reshape(spec.shape)
    return out


# --------------------------------------------------------------------------- chunks


def chunk_ranges(total_bytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk; an empty payload is one empty chunk."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
    if total_bytes < 0:
        raise ValueError(f"total_bytes must be >= 0, got {total_bytes}")
    if total_bytes == 0:
        return [(0, 0)]
    return [
        (off, min(chunk_bytes, total_bytes - off)) for off in range(0, total_bytes, chunk_bytes)
    ]


def payload_chunk(
    encoded: EncodedPayload,
    payload_id: str,
    index: int,
    chunk_bytes: int,
    bulk_uri: str = "",
    manifest_msgs: list[TensorSpecMsg] | None = None,
) -> TensorPayload:
    """Build chunk ``index`` of ``encoded`` as a TensorPayload (data is a zero-copy view).

    With ``bulk_uri`` the message is the control-plane record only (no data, one chunk).
    """
    if not payload_id:
        raise ValueError("payload_id must not be empty")
    ranges = (
        [(0, encoded.total_bytes)] if bulk_uri else chunk_ranges(encoded.total_bytes, chunk_bytes)
    )
    if not 0 <= index < len(ranges):
        raise ValueError(f"chunk index {index} out of range [0, {len(ranges)})")
    offset, length = ranges[index]
    msg = TensorPayload(
        payload_id=payload_id,
        manifest=manifest_msgs if manifest_msgs is not None else manifest_to_msgs(encoded.manifest),
        encoding=encoded.encoding,
        total_bytes=encoded.total_bytes,
        chunk_index=index,
        chunk_count=len(ranges),
        chunk_offset=offset,
        bulk_uri=bulk_uri,
        sha256=encoded.sha256,
    )
    if encoded.scales.size:
        set_float32_field(msg, "scales", encoded.scales)
    if not bulk_uri:
        set_bytes_field(msg, "data", encoded.data[offset : offset + length])
    return msg


def payload_header(msg: TensorPayload) -> dict[str, Any]:
    """The fields every chunk of one payload must agree on (for mixing checks)."""
    return {
        "payload_id": msg.payload_id,
        "encoding": int(msg.encoding),
        "total_bytes": int(msg.total_bytes),
        "chunk_count": int(msg.chunk_count),
        "sha256": msg.sha256,
        "bulk_uri": msg.bulk_uri,
    }

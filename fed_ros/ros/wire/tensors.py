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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fed_ros.core import encodings
from fed_ros.core.encodings.base import numel as _numel
from fed_ros.core.encodings.topk import DEFAULT_FRACTION
from fed_ros.core.params import Manifest, TensorSpec, manifest_of
from fed_ros.msg import TensorPayload, TensorSpec as TensorSpecMsg

StateDict = dict[str, np.ndarray]

# Encoding names <-> TensorPayload.encoding values (the registry's; `fed_ros.core.encodings`).
ENCODINGS: dict[str, int] = {e.name: e.wire_id for e in encodings.REGISTRY}
ENCODING_NAMES: dict[int, str] = {v: k for k, v in ENCODINGS.items()}
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


def encoded_size(manifest: Sequence[TensorSpec], encoding: int) -> int:
    """Number of payload bytes the manifest implies under an ``encoding`` of fixed size (a delta
    payload's size depends on the sender: see :func:`size_range`)."""
    lo, hi = size_range(manifest, encoding)
    if lo != hi:
        raise ValueError(f"a {ENCODING_NAMES[encoding]} payload has no fixed size; use size_range")
    return lo


def size_range(manifest: Sequence[TensorSpec], encoding: int) -> tuple[int, int]:
    """(smallest, largest) payload bytes the manifest allows under ``encoding``: one size for
    the dense encodings; for the delta ones the encoding's bounds (decoding checks the rest)."""
    return encodings.by_wire_id(encoding).size_range([_numel(s.shape) for s in manifest])


def _encoding(encoding: int | str) -> encodings.Encoding:
    if isinstance(encoding, str):
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown encoding {encoding!r}; expected one of {sorted(ENCODINGS)}")
        return encodings.BY_NAME[encoding]
    return encodings.by_wire_id(encoding)


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
    encoding: int | str | encodings.Encoding = "float32",
    topk_fraction: float = DEFAULT_FRACTION,
) -> EncodedPayload:
    """Pack a state dict into one buffer (one pass over the tensors) and hash it.

    Under ``topk``, ``sd`` is a delta (what to add to the start model) and ``topk_fraction`` of
    each tensor's entries travel (an `Encoding` instance keeps its own fraction); under
    ``int8_delta``/``int4_delta`` it is a delta too, all of it quantized and deflated."""
    if isinstance(encoding, encodings.Encoding):
        enc = encoding
    else:
        enc = _encoding(encoding).with_fraction(topk_fraction)
    specs = manifest_of(sd)  # validates: ndarray, float32, non-empty unique names
    data, scales = enc.encode(sd)
    return EncodedPayload(
        manifest=tuple(specs),
        encoding=enc.wire_id,
        scales=scales,
        data=data,
        sha256=sha256_hex(data),
    )


def decode_state_dict(
    manifest: Sequence[TensorSpec],
    encoding: int | str,
    data: Any,
    scales: Sequence[float] | np.ndarray = (),
    copy: bool = False,
) -> StateDict:
    """Unpack payload bytes into a state dict; float32 tensors are zero-copy views unless
    ``copy``. A delta encoding gives the delta (zeros where a sparse one sent nothing)."""
    enc = _encoding(encoding)
    buf = bytes_view(data) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    lo, hi = enc.size_range([_numel(s.shape) for s in manifest])
    if not lo <= buf.nbytes <= hi:
        raise ValueError(
            f"payload has {buf.nbytes} bytes; manifest and encoding "
            f"{enc.name} imply {lo if lo == hi else f'{lo}..{hi}'}"
        )
    flat = enc.decode(
        buf,
        [_numel(s.shape) for s in manifest],
        [s.name for s in manifest],
        np.asarray(scales, dtype=np.float32).reshape(-1),
    )
    return {s.name: v.astype(s.dtype, copy=copy).reshape(s.shape) for s, v in zip(manifest, flat)}


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

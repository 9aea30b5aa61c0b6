"""Update and model compression: the value encodings a fleet may put on the wire (issue 26).

``float32`` (exact), ``float16`` (2 bytes a value; refused above the float16 range instead of
turning into inf), ``int8`` (one scale per tensor) and ``int8_block``: one float32 scale per
block of :data:`BLOCK` consecutive values of a tensor (absmax / 127), then one int8 per value,
as NVFlare's blockwise-8 filter and bitsandbytes do. A block scale keeps one large weight from
flattening every small one of the same tensor to zero, which a per-tensor scale does: the
error of a value is at most half its own block's step.

Pure numpy, so the wire format (:mod:`fed_ros.ros.wire.tensors`) and the benchmarks (which
pass updates and models through :func:`roundtrip` to measure what an encoding costs in
success) share one implementation. Every decoder refuses non-finite scales: a payload whose
decoded values would not be finite is rejected like any other bad update.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

BLOCK = 128  # values per int8 block scale (the issue asks for 64-256)
FLOAT16_MAX = float(np.finfo(np.float16).max)
ENCODING_NAMES = ("float32", "float16", "int8", "int8_block")
# Wire bytes per value, and per-block overhead, of each encoding (int8: one scale per tensor
# travels beside the payload; int8_block: the block scales are inside the payload).
_VALUE_BYTES = {"float32": 4, "float16": 2, "int8": 1, "int8_block": 1}


def block_count(n: int) -> int:
    """Blocks (scales) of a tensor of ``n`` values."""
    return -(-int(n) // BLOCK)


def block_nbytes(n: int) -> int:
    """Payload bytes of one tensor of ``n`` values under ``int8_block``: scales, then values."""
    return 4 * block_count(n) + int(n)


def check_encoding(encoding: str) -> str:
    """``encoding`` if it is a known name, else ValueError naming it and the choices."""
    if encoding not in ENCODING_NAMES:
        raise ValueError(f"unknown encoding {encoding!r}; expected one of {list(ENCODING_NAMES)}")
    return encoding


def quantize_blocks(values: np.ndarray, name: str = "tensor") -> tuple[np.ndarray, np.ndarray]:
    """(block scales float32 (blocks,), int8 values (n,)) of a flat tensor; ValueError when a
    value is not finite."""
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    n = flat.size
    nb = block_count(n)
    padded = np.zeros(nb * BLOCK, dtype=np.float32)
    padded[:n] = flat
    blocks = padded.reshape(nb, BLOCK)
    peak = np.abs(blocks).max(axis=1) if nb else np.zeros(0, np.float32)
    if not np.all(np.isfinite(peak)):
        raise ValueError(f"tensor {name!r} is not finite; int8_block encoding needs finite values")
    scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(blocks / scales[:, None]), -127, 127).astype(np.int8)
    return scales, q.reshape(-1)[:n]


def dequantize_blocks(scales: np.ndarray, q: np.ndarray) -> np.ndarray:
    """float32 values of ``q`` (int8, n values) under its block ``scales``; ValueError when the
    scale count does not fit n or a scale is not finite (the values would not be)."""
    q = np.asarray(q).reshape(-1)
    scales = np.asarray(scales, dtype=np.float32).reshape(-1)
    if scales.size != block_count(q.size):
        raise ValueError(
            f"int8_block: {q.size} values need {block_count(q.size)} block scales, "
            f"got {scales.size}"
        )
    if not np.all(np.isfinite(scales)):
        raise ValueError("int8_block: a block scale is not finite")
    per_value = np.repeat(scales, BLOCK)[: q.size]
    return q.astype(np.float32) * per_value


def roundtrip(sd: Mapping[str, np.ndarray], encoding: str) -> dict[str, np.ndarray]:
    """What the receiver decodes after ``sd`` travelled under ``encoding`` (float32 copies).

    The in-process benchmarks use it to charge an encoding's error without a wire."""
    check_encoding(encoding)
    out: dict[str, np.ndarray] = {}
    for name, value in sd.items():
        arr = np.asarray(value, dtype=np.float32)
        if encoding == "float32":
            dec = arr.copy()
        elif encoding == "float16":
            if arr.size and float(np.max(np.abs(arr))) > FLOAT16_MAX:
                raise ValueError(f"tensor {name!r} exceeds the float16 range (|x| > {FLOAT16_MAX})")
            dec = arr.astype(np.float16).astype(np.float32)
        elif encoding == "int8":
            peak = float(np.max(np.abs(arr))) if arr.size else 0.0
            if not math.isfinite(peak):
                raise ValueError(
                    f"tensor {name!r} is not finite; int8 encoding needs finite values"
                )
            scale = np.float32(peak / 127.0 if peak > 0 else 1.0)
            dec = np.clip(np.rint(arr / scale), -127, 127).astype(np.float32) * scale
        else:
            dec = dequantize_blocks(*quantize_blocks(arr, name)).reshape(arr.shape)
        out[name] = dec.reshape(arr.shape)
    return out


def encoded_nbytes(sd: Mapping[str, np.ndarray], encoding: str) -> int:
    """Payload bytes of ``sd`` under ``encoding`` (int8's per-tensor scales included: 4 each)."""
    check_encoding(encoding)
    sizes = [int(np.asarray(v).size) for v in sd.values()]
    if encoding == "int8_block":
        return sum(block_nbytes(n) for n in sizes)
    extra = 4 * len(sizes) if encoding == "int8" else 0
    return sum(sizes) * _VALUE_BYTES[encoding] + extra

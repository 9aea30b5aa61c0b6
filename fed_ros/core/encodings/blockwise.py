"""Update and model compression: the value encodings a fleet may put on the wire (issue 26).

``float32`` (exact), ``float16`` (2 bytes a value; refused above the float16 range instead of
turning into inf), ``int8`` (one scale per tensor) and ``int8_block``: one float32 scale per
block of :data:`BLOCK` consecutive values of a tensor (absmax / 127), then one int8 per value,
as NVFlare's blockwise-8 filter and bitsandbytes do. A block scale keeps one large weight from
flattening every small one of the same tensor to zero, which a per-tensor scale does: the
error of a value is at most half its own block's step. ``int4_block`` is the same with 4 bits a
value (levels -7..7, two values a byte) and a scale per :data:`BLOCK4` values.

Pure numpy, so the wire format (:mod:`fed_ros.ros.wire.tensors`) and the benchmarks (which
pass updates and models through :func:`roundtrip` to measure what an encoding costs in
success) share one implementation. Every decoder refuses non-finite scales: a payload whose
decoded values would not be finite is rejected like any other bad update.
"""

from __future__ import annotations

from typing import Any

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

BLOCK = 128  # values per int8 block scale (the issue asks for 64-256)
# int4_block: 4 bits a value, one float32 scale per 64 values (NVFlare's 4-bit filters use 64):
# 0.5625 bytes a value, 7.1x fewer than float32.
BLOCK4 = 64
FLOAT16_MAX = float(np.finfo(np.float16).max)
ENCODING_NAMES = ("float32", "float16", "int8", "int8_block", "int4_block")
# The blockwise encodings: (values per block scale, largest integer level); the scales are inside
# the payload before each tensor's values.
BLOCKWISE = {"int8_block": (BLOCK, 127), "int4_block": (BLOCK4, 7)}
# Wire bytes per value of the other encodings (int8: one scale per tensor travels beside the
# payload).
_VALUE_BYTES = {"float32": 4, "float16": 2, "int8": 1}


def block_count(n: int, block: int = BLOCK) -> int:
    """Blocks (scales) of a tensor of ``n`` values."""
    return -(-int(n) // block)


def block_nbytes(n: int, encoding: str = "int8_block") -> int:
    """Payload bytes of one tensor of ``n`` values under a blockwise encoding: scales, then values
    (int4_block: two a byte, the low nibble first)."""
    block, _ = BLOCKWISE[encoding]
    values = int(n) if encoding == "int8_block" else -(-int(n) // 2)
    return 4 * block_count(n, block) + values


def encode_block_tensor(values: NDArray[Any], encoding: str, name: str = "tensor") -> bytes:
    """One tensor's payload bytes under a blockwise encoding (ValueError when not finite)."""
    block, levels = BLOCKWISE[encoding]
    scales, q = quantize_blocks(values, name, block, levels, encoding)
    if encoding == "int8_block":
        packed = q.view(np.uint8)
    else:  # offset to 1..15, two per byte
        nib = (q.astype(np.int16) + 8).astype(np.uint8)
        if nib.size % 2:
            nib = np.append(nib, np.uint8(8))  # a padding zero
        packed = nib[0::2] | (nib[1::2] << 4)
    return scales.astype("<f4").tobytes() + packed.tobytes()


def decode_block_tensor(buf: NDArray[Any], n: int, encoding: str) -> NDArray[Any]:
    """float32 values of one tensor from its payload bytes (``block_nbytes(n)`` of them)."""
    block, _ = BLOCKWISE[encoding]
    head = 4 * block_count(n, block)
    scales = np.asarray(buf[:head]).view("<f4")
    body = np.asarray(buf[head:])
    if encoding == "int8_block":
        q = body.view(np.int8)
    else:
        q = np.empty(2 * body.size, dtype=np.int8)
        q[0::2] = (body & 0x0F).astype(np.int8) - 8
        q[1::2] = (body >> 4).astype(np.int8) - 8
        q = q[:n]
    return dequantize_blocks(scales, q, block, encoding)


def check_encoding(encoding: str) -> str:
    """``encoding`` if it is a known name, else ValueError naming it and the choices."""
    if encoding not in ENCODING_NAMES:
        raise ValueError(f"unknown encoding {encoding!r}; expected one of {list(ENCODING_NAMES)}")
    return encoding


def quantize_blocks(
    values: NDArray[Any],
    name: str = "tensor",
    block: int = BLOCK,
    levels: int = 127,
    encoding: str = "int8_block",
) -> tuple[NDArray[Any], NDArray[Any]]:
    """(block scales float32 (blocks,), int8 levels in [-levels, levels] (n,)) of a flat tensor;
    ValueError when a value is not finite."""
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    n = flat.size
    nb = block_count(n, block)
    padded = np.zeros(nb * block, dtype=np.float32)
    padded[:n] = flat
    blocks = padded.reshape(nb, block)
    peak = np.abs(blocks).max(axis=1) if nb else np.zeros(0, np.float32)
    if not np.all(np.isfinite(peak)):
        raise ValueError(f"tensor {name!r} is not finite; {encoding} encoding needs finite values")
    scales = np.where(peak > 0, peak / float(levels), 1.0).astype(np.float32)
    q = np.clip(np.rint(blocks / scales[:, None]), -levels, levels).astype(np.int8)
    return scales, q.reshape(-1)[:n]


def dequantize_blocks(
    scales: NDArray[Any], q: NDArray[Any], block: int = BLOCK, encoding: str = "int8_block"
) -> NDArray[Any]:
    """float32 values of ``q`` (int8 levels, n values) under its block ``scales``; ValueError when
    the scale count does not fit n or a scale is not finite (the values would not be)."""
    q = np.asarray(q).reshape(-1)
    scales = np.asarray(scales, dtype=np.float32).reshape(-1)
    if scales.size != block_count(q.size, block):
        raise ValueError(
            f"{encoding}: {q.size} values need {block_count(q.size, block)} block scales, "
            f"got {scales.size}"
        )
    if not np.all(np.isfinite(scales)):
        raise ValueError(f"{encoding}: a block scale is not finite")
    per_value = np.repeat(scales, block)[: q.size]
    values: NDArray[Any] = q.astype(np.float32) * per_value
    return values


def roundtrip(sd: Mapping[str, NDArray[Any]], encoding: str) -> dict[str, NDArray[Any]]:
    """What the receiver decodes after ``sd`` travelled under ``encoding`` (float32 copies).

    The in-process benchmarks use it to charge an encoding's error without a wire."""
    check_encoding(encoding)
    out: dict[str, NDArray[Any]] = {}
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
        else:  # blockwise
            raw = np.frombuffer(encode_block_tensor(arr, encoding, name), np.uint8)
            dec = decode_block_tensor(raw, arr.size, encoding)
        out[name] = dec.reshape(arr.shape)
    return out


def encoded_nbytes(sd: Mapping[str, NDArray[Any]], encoding: str) -> int:
    """Payload bytes of ``sd`` under ``encoding`` (int8's per-tensor scales included: 4 each)."""
    check_encoding(encoding)
    sizes = [int(np.asarray(v).size) for v in sd.values()]
    if encoding in BLOCKWISE:
        return sum(block_nbytes(n, encoding) for n in sizes)
    extra = 4 * len(sizes) if encoding == "int8" else 0
    return sum(sizes) * _VALUE_BYTES[encoding] + extra

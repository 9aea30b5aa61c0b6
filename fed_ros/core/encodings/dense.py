"""The dense value encodings: ``float32`` (exact), ``float16`` and ``int8`` (issue 26).

``float16`` is 2 bytes a value and is refused above the float16 range instead of turning into
inf. ``int8`` is one byte a value with one float32 scale per tensor (absmax / 127) that travels
beside the payload in ``TensorPayload.scales``.

Encoding writes each tensor straight into one preallocated payload buffer: the only copy of the
tensor bytes (issue 2's rule). Decoding ``float32`` returns views over the received buffer.
"""

from __future__ import annotations

from typing import Any

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.encodings.base import Encoding, no_scales

FLOAT16_MAX = float(np.finfo(np.float16).max)


class DenseEncoding(Encoding):
    """A fixed number of bytes per value, in one little-endian dtype."""

    wire_dtype: np.dtype[Any] = np.dtype("<f4")

    def size_range(self, sizes: Sequence[int]) -> tuple[int, int]:
        size = sum(int(n) for n in sizes) * self.wire_dtype.itemsize
        return size, size

    def _fill(
        self, dest: NDArray[Any], arr: NDArray[Any], name: str, i: int, scales: NDArray[Any]
    ) -> None:
        np.copyto(dest, arr.reshape(-1), casting="same_kind")

    def _new_scales(self, tensors: int) -> NDArray[Any]:
        return no_scales()

    def encode(self, sd: Mapping[str, NDArray[Any]]) -> tuple[NDArray[Any], NDArray[Any]]:
        arrays = [(name, np.asarray(v)) for name, v in sd.items()]
        item = self.wire_dtype.itemsize
        data = np.empty(sum(a.size for _, a in arrays) * item, dtype=np.uint8)
        scales = self._new_scales(len(arrays))
        offset = 0
        for i, (name, arr) in enumerate(arrays):
            dest = data[offset : offset + arr.size * item].view(self.wire_dtype)
            self._fill(dest, arr, name, i, scales)
            offset += arr.size * item
        return data, scales

    def decode(
        self, buf: NDArray[Any], sizes: Sequence[int], names: Sequence[str], scales: NDArray[Any]
    ) -> list[NDArray[Any]]:
        item = self.wire_dtype.itemsize
        out = []
        offset = 0
        for n in sizes:
            out.append(buf[offset : offset + int(n) * item].view(self.wire_dtype))
            offset += int(n) * item
        return out


class Float32(DenseEncoding):
    """Exact: 4 bytes a value; decoded tensors are views over the received bytes."""

    name = "float32"
    wire_id = 0
    bytes_per_value = 4.0


class Float16(DenseEncoding):
    """2 bytes a value; a tensor beyond the float16 range is refused, never sent as inf."""

    name = "float16"
    wire_id = 1
    bytes_per_value = 2.0
    wire_dtype = np.dtype("<f2")

    def _fill(
        self, dest: NDArray[Any], arr: NDArray[Any], name: str, i: int, scales: NDArray[Any]
    ) -> None:
        if arr.size and float(np.max(np.abs(arr))) > FLOAT16_MAX:
            # float16 would turn these into inf silently; the server rejects non-finite updates.
            raise ValueError(f"tensor {name!r} exceeds the float16 range (|x| > {FLOAT16_MAX})")
        super()._fill(dest, arr, name, i, scales)

    def decode(
        self, buf: NDArray[Any], sizes: Sequence[int], names: Sequence[str], scales: NDArray[Any]
    ) -> list[NDArray[Any]]:
        return [v.astype(np.float32) for v in super().decode(buf, sizes, names, scales)]


class Int8(DenseEncoding):
    """1 byte a value, one float32 scale per tensor beside the payload (value = int8 x scale)."""

    name = "int8"
    wire_id = 2
    bytes_per_value = 1.0
    wire_dtype = np.dtype("i1")

    def scale_count(self, tensors: int) -> int:
        return int(tensors)

    def _new_scales(self, tensors: int) -> NDArray[Any]:
        return np.zeros(tensors, dtype=np.float32)

    def _fill(
        self, dest: NDArray[Any], arr: NDArray[Any], name: str, i: int, scales: NDArray[Any]
    ) -> None:
        peak = float(np.max(np.abs(arr))) if arr.size else 0.0
        if not math.isfinite(peak):
            raise ValueError(f"tensor {name!r} is not finite; int8 encoding needs finite values")
        scale = peak / 127.0 if peak > 0 else 1.0
        scales[i] = scale
        np.clip(np.rint(arr.reshape(-1) / scale), -127, 127, out=dest, casting="unsafe")

    def decode(
        self, buf: NDArray[Any], sizes: Sequence[int], names: Sequence[str], scales: NDArray[Any]
    ) -> list[NDArray[Any]]:
        scale_arr = np.asarray(scales, dtype=np.float32).reshape(-1)
        if scale_arr.size != len(sizes):
            raise ValueError(f"int8 payload needs {len(sizes)} scales, got {scale_arr.size}")
        if not np.all(np.isfinite(scale_arr)):
            raise ValueError("int8 payload has non-finite scales")
        raw = super().decode(buf, sizes, names, scales)
        return [r.astype(np.float32) * scale_arr[i] for i, r in enumerate(raw)]

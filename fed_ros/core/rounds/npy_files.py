"""Pickle-free ``.npy`` files for the model store: streamed out, checked back in.

The model store keeps every array as a ``.npy`` file. Writing goes through a byte sink (the
store's hashing writer) in pieces, header first, so a flat cluster model is never materialised
in RAM and its checksum costs no second read; reading uses ``allow_pickle=False`` only. These
are the file format of one array, independent of the store's commit protocol (temp names,
fsync, manifest), which is :mod:`fed_ros.core.rounds.store`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np


class ByteSink(Protocol):
    """Where an array's bytes are streamed (a file, or the store's hashing wrapper of one)."""

    def write(self, data) -> int: ...


def npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The ``.npy`` (format 2.0) header of a C-order array of this shape and dtype."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_2_0(
        buf,
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False,
            "shape": shape,
        },
    )
    return buf.getvalue()


def tensor_writer(sd: Mapping[str, np.ndarray], total: int) -> Callable[[ByteSink], None]:
    """Writes a state dict as one flat little-endian float32 ``.npy`` of ``total`` values."""

    def write(w: ByteSink) -> None:
        # Header, then each tensor's bytes: the flat vector is never materialised in RAM.
        w.write(npy_header((total,), np.dtype("<f4")))
        for arr in sd.values():
            w.write(memoryview(np.ascontiguousarray(arr, dtype="<f4")).cast("B"))

    return write


def array_writer(arr: np.ndarray) -> Callable[[ByteSink], None]:
    """Writes one array (any shape, 0-d included) as a little-endian ``.npy``."""

    def write(w: ByteSink) -> None:
        a = np.ascontiguousarray(arr).reshape(arr.shape)  # ascontiguousarray makes 0-d arrays (1,)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        w.write(npy_header(a.shape, a.dtype))
        if a.size:
            w.write(memoryview(a.reshape(-1)).cast("B"))

    return write


def load_npy(path: Path) -> np.ndarray:
    """A ``.npy`` file's array in native byte order; ValueError when unreadable (or pickled)."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"unreadable array {path.name} ({exc})") from None
    return arr.astype(arr.dtype.newbyteorder("="), copy=False)

"""Model parameters as ordered named float32 tensors (state dicts of numpy arrays).

A state dict is the unit that crosses every seam (learning <-> core <-> ros). The server
works on flat float32 vectors laid out in manifest order, so aggregation is one BLAS call
over a contiguous (K, P) array instead of a Python loop over tensors.
"""

from __future__ import annotations

from typing import Any

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

StateDict = dict[str, NDArray[Any]]

_ALLOWED_DTYPES = ("float32",)


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one tensor of a state dict."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tensor name must be a non-empty string, got {self.name!r}")
        shape = tuple(int(d) for d in self.shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor {self.name!r}: negative dimension in shape {shape}")
        object.__setattr__(self, "shape", shape)
        if self.dtype not in _ALLOWED_DTYPES:
            raise ValueError(f"tensor {self.name!r}: dtype {self.dtype!r} not in {_ALLOWED_DTYPES}")

    @property
    def numel(self) -> int:
        """Number of elements."""
        return int(math.prod(self.shape))

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly form (for stores and messages)."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> "TensorSpec":
        """Inverse of `to_json`; raises ValueError on malformed input."""
        try:
            return TensorSpec(
                str(obj["name"]), tuple(int(d) for d in obj["shape"]), str(obj["dtype"])
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed tensor spec {obj!r}") from exc


Manifest = tuple[TensorSpec, ...]


def manifest_of(sd: Mapping[str, NDArray[Any]]) -> Manifest:
    """Manifest (names, shapes, dtypes in order) of a state dict; rejects non-float32 tensors."""
    if not isinstance(sd, Mapping):
        raise ValueError(f"state dict must be a mapping, got {type(sd).__name__}")
    specs = []
    for name, arr in sd.items():
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"tensor {name!r} is {type(arr).__name__}, expected numpy.ndarray")
        specs.append(TensorSpec(name, tuple(arr.shape), str(arr.dtype)))
    return tuple(specs)


def manifest_to_json(manifest: Manifest) -> list[dict[str, Any]]:
    """Manifest as a JSON list."""
    return [s.to_json() for s in manifest]


def manifest_from_json(obj: Iterable[Mapping[str, Any]]) -> Manifest:
    """Manifest from its JSON list."""
    return tuple(TensorSpec.from_json(o) for o in obj)


def num_params(manifest: Manifest) -> int:
    """Total number of scalars P described by a manifest."""
    return sum(s.numel for s in manifest)


_NP_DTYPES = {d: np.dtype(d) for d in _ALLOWED_DTYPES}


def _matches_manifest(sd: Mapping[str, NDArray[Any]], expected: Manifest) -> bool:
    """Fast exact check (names in order, ndarray, shape, dtype) without building a manifest."""
    if not isinstance(sd, Mapping) or len(sd) != len(expected):
        return False
    for (name, arr), spec in zip(sd.items(), expected):
        if (
            name != spec.name
            or not isinstance(arr, np.ndarray)
            or arr.shape != spec.shape
            or arr.dtype != _NP_DTYPES[spec.dtype]
        ):
            return False
    return True


def check_manifest(sd: Mapping[str, NDArray[Any]], expected: Manifest) -> None:
    """Raise ValueError naming the first tensor whose name, order, shape or dtype differs."""
    # Honest updates take the fast path (it runs K times per round); only a mismatch pays
    # for building the full manifest to name the offending tensor.
    if _matches_manifest(sd, expected):
        return
    got = manifest_of(sd)
    exp_names = [s.name for s in expected]
    got_names = [s.name for s in got]
    missing = [n for n in exp_names if n not in sd]
    if missing:
        raise ValueError(f"state dict lacks tensor {missing[0]!r} (missing {len(missing)})")
    extra = [n for n in got_names if n not in set(exp_names)]
    if extra:
        raise ValueError(f"state dict has unexpected tensor {extra[0]!r} ({len(extra)} extra)")
    for pos, (g, e) in enumerate(zip(got, expected)):
        if g.name != e.name:
            raise ValueError(
                f"tensor {g.name!r} at position {pos}, expected {e.name!r} (order differs)"
            )
        if g.shape != e.shape:
            raise ValueError(f"tensor {g.name!r} has shape {g.shape}, expected {e.shape}")
        if g.dtype != e.dtype:
            raise ValueError(f"tensor {g.name!r} has dtype {g.dtype}, expected {e.dtype}")


def check_finite(sd: Mapping[str, NDArray[Any]]) -> None:
    """Raise ValueError naming the first tensor holding NaN or Inf."""
    for name, arr in sd.items():
        if not np.isfinite(arr).all():
            bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
            raise ValueError(f"tensor {name!r} has {bad} non-finite values (NaN/Inf)")


def offsets(manifest: Manifest) -> dict[str, tuple[int, int]]:
    """Start and stop index of each tensor inside the flat vector."""
    out: dict[str, tuple[int, int]] = {}
    pos = 0
    for s in manifest:
        out[s.name] = (pos, pos + s.numel)
        pos += s.numel
    return out


def flatten(sd: Mapping[str, NDArray[Any]], out: NDArray[Any] | None = None) -> NDArray[Any]:
    """Concatenate tensors in order into one float32 1-D vector (into `out` when given)."""
    total = sum(int(np.size(a)) for a in sd.values())
    if out is None:
        out = np.empty(total, dtype=np.float32)
    elif out.shape != (total,) or out.dtype != np.float32:
        raise ValueError(
            f"flatten: out has shape {out.shape} dtype {out.dtype}, expected ({total},) float32"
        )
    pos = 0
    for name, arr in sd.items():
        n = int(np.size(arr))
        if arr.dtype != np.float32:
            raise ValueError(f"tensor {name!r} has dtype {arr.dtype}, expected float32")
        out[pos : pos + n] = arr.reshape(-1)
        pos += n
    return out


def unflatten(vec: NDArray[Any], manifest: Manifest, copy: bool = False) -> StateDict:
    """Split a flat float32 vector into a state dict; views into `vec` unless copy=True."""
    vec = np.asarray(vec)
    total = num_params(manifest)
    if vec.ndim != 1 or vec.shape[0] != total:
        raise ValueError(
            f"unflatten: vector of shape {vec.shape} does not match manifest size {total}"
        )
    if vec.dtype != np.float32:
        raise ValueError(f"unflatten: vector dtype {vec.dtype}, expected float32")
    if copy:
        vec = vec.copy()
    out: StateDict = {}
    pos = 0
    for s in manifest:
        out[s.name] = vec[pos : pos + s.numel].reshape(s.shape)
        pos += s.numel
    return out


def select_prefix(sd: Mapping[str, NDArray[Any]], prefixes: Sequence[str]) -> StateDict:
    """Sub-state-dict of tensors whose name starts with any prefix (order kept)."""
    if isinstance(prefixes, str):
        prefixes = (prefixes,)
    pre = tuple(prefixes)
    return {k: v for k, v in sd.items() if k.startswith(pre)}


def prefix_columns(manifest: Manifest, prefixes: Sequence[str]) -> NDArray[Any] | slice:
    """Flat-vector columns of the tensors matching `prefixes`: a slice when contiguous."""
    if isinstance(prefixes, str):
        prefixes = (prefixes,)
    pre = tuple(prefixes)
    spans = [(a, b) for name, (a, b) in offsets(manifest).items() if name.startswith(pre)]
    if not spans:
        return np.zeros(0, dtype=np.int64)
    # Merge touching spans so the common case (one submodule) stays a zero-copy slice.
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and merged[-1][1] == a:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    if len(merged) == 1:
        return slice(merged[0][0], merged[0][1])
    columns: NDArray[Any] | slice = np.concatenate([np.arange(a, b) for a, b in merged])
    return columns


def _address(arr: NDArray[Any]) -> int:
    address: int = arr.__array_interface__["data"][0]
    return address


def shared_buffer_rows(
    sds: Sequence[Mapping[str, NDArray[Any]]], manifest: Manifest
) -> tuple[NDArray[Any], list[int]] | None:
    """If every state dict is a row view of one (R, P) buffer (see UpdateBuffer), return it and the
    rows."""
    if not sds or not manifest:
        return None
    first = next(iter(sds[0].values()))
    base = first.base
    P = num_params(manifest)
    if (
        base is None
        or not isinstance(base, np.ndarray)
        or base.ndim != 2
        or base.shape[1] != P
        or base.dtype != np.float32
        or not base.flags.c_contiguous
    ):
        return None
    # Byte offset of every tensor inside a row; the base address is read once (reading an
    # address costs a few microseconds and this runs for K x tensors per round).
    base_addr = _address(base)
    row_bytes = 4 * P
    starts = [4 * a for a, _ in offsets(manifest).values()]
    rows = []
    for sd in sds:
        row = -1
        for spec, start in zip(manifest, starts):
            arr = sd.get(spec.name)
            if (
                arr is None
                or arr.base is not base
                or not arr.flags.c_contiguous
                or arr.shape != spec.shape
            ):
                return None
            rel = _address(arr) - base_addr - start
            if rel < 0 or rel % row_bytes or (row >= 0 and rel // row_bytes != row):
                return None
            row = rel // row_bytes
        rows.append(int(row))
    if len(set(rows)) != len(rows):
        return None
    return base, rows


def stack_state_dicts(
    sds: Sequence[Mapping[str, NDArray[Any]]], manifest: Manifest
) -> NDArray[Any]:
    """One contiguous (K, P) float32 array of the flattened state dicts (one copy pass).

    When the state dicts already are rows of one UpdateBuffer in order, the buffer rows are
    returned without copying.
    """
    shared = shared_buffer_rows(sds, manifest)
    if shared is not None:
        base, rows = shared
        if rows == list(range(rows[0], rows[0] + len(rows))):
            return base[rows[0] : rows[0] + len(rows)]
    P = num_params(manifest)
    out = np.empty((len(sds), P), dtype=np.float32)
    for k, sd in enumerate(sds):
        flatten(sd, out=out[k])
    return out


class UpdateBuffer:
    """Preallocated (capacity, P) float32 buffer that receivers write updates into.

    `slot()` hands out a state dict of views into the next row; filling it in place (e.g.
    from received chunks) and passing it on avoids the K-model copy when the server stacks
    the updates, which keeps server peak memory near (K + 3) model sizes.
    """

    def __init__(self, manifest: Manifest, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"UpdateBuffer capacity must be >= 1, got {capacity}")
        self.manifest = tuple(manifest)
        self.data = np.zeros((int(capacity), num_params(self.manifest)), dtype=np.float32)
        self._used = 0

    def __len__(self) -> int:
        return self._used

    def slot(self) -> StateDict:
        """Views into the next free row (raises ValueError when full)."""
        if self._used >= self.data.shape[0]:
            raise ValueError(f"UpdateBuffer full (capacity {self.data.shape[0]})")
        row = self.data[self._used]
        self._used += 1
        return unflatten(row, self.manifest)

    def add(self, sd: Mapping[str, NDArray[Any]]) -> StateDict:
        """Copy a state dict into the next row after checking its manifest; returns the views."""
        check_manifest(sd, self.manifest)
        views = self.slot()
        flatten(sd, out=self.data[self._used - 1])
        return views

    def clear(self) -> None:
        """Reuse the buffer for the next round (views handed out before stay valid but get
        overwritten)."""
        self._used = 0


def as_state_dict(sd: Mapping[str, NDArray[Any]]) -> StateDict:
    """Validated plain-dict copy-free view of a mapping (float32 tensors only)."""
    manifest_of(sd)  # validates types and dtypes
    return dict(sd)

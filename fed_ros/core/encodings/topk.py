"""Top-k sparse update deltas with error feedback (issue 26; Stich et al., "Sparsified SGD with
memory", and Lin et al., "Deep Gradient Compression").

A robot sends, per tensor, only the ``k = ceil(fraction * n)`` largest-magnitude entries of its
update delta (trained model minus the cluster model it started from) as (index, value) pairs.
What it leaves out is not lost: :class:`ErrorFeedback` keeps it as a residual on the robot and
adds it to the next round's delta, so every coordinate's change eventually reaches the server.
The server rebuilds the update as the round's cluster model (decoded exactly as it was sent)
plus the decoded delta, then checks it like any dense update.

Payload layout, per tensor in manifest order (little-endian): ``k`` (uint32), ``k`` indices
(uint32, strictly increasing, < n), ``k`` values (float32); when ``k == n`` (a tensor sent whole,
see DENSE_MAX) the indices are left out. Pure numpy: the wire format
(:mod:`fed_ros.ros.wire.tensors`), the size checks and the benchmarks share it. Every decoder
refuses a count above n, unsorted or repeated or out-of-range indices, non-finite values and a
payload that is not exactly consumed: a hostile payload is rejected, never half-applied.
"""

from __future__ import annotations

from typing import Any

import math
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

TOPK = "topk"
DEFAULT_FRACTION = 0.1  # 8 bytes per kept value: 0.1 -> 5x fewer bytes than float32
# Tensors this small travel whole, as Deep Gradient Compression does for biases and norms: they
# hold about 2 % of a policy's values, and the input normaliser's statistics are among them.
# Sparsified, a 7-value statistic moved one entry a round and FedDRMan's success fell from 0.53
# to 0.03 (measured, fed-ros bench federation --encoding topk, 5 seeds).
DENSE_MAX = 256
_HEAD = 4  # uint32 count per tensor
_PAIR = 8  # uint32 index + float32 value
_VALUE = 4  # float32 value of a tensor sent whole (count == size: no indices)


def parse_topk(encoding: str) -> float | None:
    """The fraction of a ``topk`` or ``topk:<fraction>`` encoding name (None: not topk); a
    benchmark names its update encoding this way (``--encoding topk:0.05``)."""
    if encoding == TOPK:
        return DEFAULT_FRACTION
    if isinstance(encoding, str) and encoding.startswith(TOPK + ":"):
        try:
            return check_fraction(float(encoding[len(TOPK) + 1 :]))
        except ValueError:
            raise ValueError(
                f"encoding {encoding!r}: the top-k fraction must be a number in (0, 1]"
            ) from None
    return None


def starts_from_one_cluster(membership: Sequence[tuple[int, float]], picked: bool) -> bool:
    """Whether a robot's start model is one cluster's model as sent (IFCA's pick, or a single
    cluster): only then can the server rebuild its update from a delta."""
    return picked or sum(1 for _, w in membership if w > 0) == 1


def check_fraction(fraction: float) -> float:
    """``fraction`` if it is a number in (0, 1], else ValueError naming it."""
    if not (
        isinstance(fraction, (int, float))
        and not isinstance(fraction, bool)
        and math.isfinite(fraction)
        and 0.0 < fraction <= 1.0
    ):
        raise ValueError(f"top-k fraction must be in (0, 1], got {fraction!r}")
    return float(fraction)


def topk_count(n: int, fraction: float) -> int:
    """Entries kept of a tensor of ``n`` values: all of a small one (DENSE_MAX), else
    ``ceil(fraction * n)`` (at least one)."""
    check_fraction(fraction)
    if int(n) <= DENSE_MAX:
        return int(n)
    return min(int(n), max(1, math.ceil(int(n) * fraction)))


def _tensor_nbytes(n: int, k: int) -> int:
    return _HEAD + (_VALUE * n if k == n else _PAIR * k)


def payload_bounds(sizes: Sequence[int]) -> tuple[int, int]:
    """(smallest, largest) payload bytes of tensors of these sizes: from every count 0 to the
    largest count short of the whole tensor, or the whole tensor. The exact size depends on the
    sender's fraction and is checked on decoding."""
    largest = [max(_tensor_nbytes(n, n), _tensor_nbytes(n, max(n - 1, 0))) for n in sizes]
    return _HEAD * len(sizes), sum(largest)


def payload_nbytes(sizes: Sequence[int], fraction: float) -> int:
    """Payload bytes of tensors of these sizes at ``fraction``."""
    return sum(_tensor_nbytes(int(n), topk_count(n, fraction)) for n in sizes)


def encode_tensor(values: NDArray[Any], fraction: float, name: str = "tensor") -> bytes:
    """One tensor's bytes: its top-k entries by magnitude (ties: the lower index)."""
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(flat)):
        raise ValueError(f"tensor {name!r} is not finite; topk encoding needs finite values")
    k = topk_count(flat.size, fraction)
    head = np.uint32(k).astype("<u4").tobytes()
    if k == flat.size:  # whole: the values alone
        encoded: bytes = head + flat.astype("<f4").tobytes()
        return encoded
    # Stable sort on -|x| keeps the choice deterministic (the robot's residual and the server's
    # view agree bit for bit) where argpartition's order is unspecified.
    idx = np.sort(np.argsort(-np.abs(flat), kind="stable")[:k])
    encoded = head + idx.astype("<u4").tobytes() + flat[idx].astype("<f4").tobytes()
    return encoded


def decode_payload(
    buf: NDArray[Any], sizes: Sequence[int], names: Sequence[str]
) -> list[NDArray[Any]]:
    """Dense float32 deltas (flat) of every tensor from a topk payload; ValueError naming the
    tensor and the field when the payload is malformed."""
    buf = np.asarray(buf).reshape(-1).view(np.uint8)
    out = []
    offset = 0
    for n, name in zip(sizes, names):
        if offset + _HEAD > buf.size:
            raise ValueError(f"topk payload ends before tensor {name!r}'s count")
        k = int(buf[offset : offset + _HEAD].view("<u4")[0])
        offset += _HEAD
        if k > n:
            raise ValueError(f"tensor {name!r}: topk count {k} > its {n} values")
        whole = k == n
        end = offset + (_VALUE * k if whole else _PAIR * k)
        if end > buf.size:
            raise ValueError(f"topk payload ends inside tensor {name!r} ({k} entries)")
        if whole:
            idx = np.arange(n, dtype=np.int64)
            vals = buf[offset:end].view("<f4")
        else:
            idx = buf[offset : offset + 4 * k].view("<u4").astype(np.int64)
            vals = buf[offset + 4 * k : end].view("<f4")
        offset = end
        if k and (int(idx[-1]) >= n or (k > 1 and not np.all(np.diff(idx) > 0))):
            raise ValueError(f"tensor {name!r}: topk indices must be strictly increasing and < {n}")
        if not np.all(np.isfinite(vals)):
            raise ValueError(f"tensor {name!r}: a topk value is not finite")
        dense = np.zeros(int(n), dtype=np.float32)
        dense[idx] = vals
        out.append(dense)
    if offset != buf.size:
        raise ValueError(f"topk payload has {buf.size - offset} bytes after the last tensor")
    return out


def roundtrip(delta: Mapping[str, NDArray[Any]], fraction: float) -> dict[str, NDArray[Any]]:
    """What the server decodes of ``delta`` sent as topk (zeros where nothing was kept)."""
    out = {}
    for name, value in delta.items():
        arr = np.asarray(value, dtype=np.float32)
        dense = decode_payload(
            np.frombuffer(encode_tensor(arr, fraction, name), np.uint8), [arr.size], [name]
        )[0]
        out[name] = dense.reshape(arr.shape)
    return out


def apply_delta(
    base: Mapping[str, NDArray[Any]] | None, delta: Mapping[str, NDArray[Any]], cluster_id: int
) -> tuple[dict[str, NDArray[Any]], str]:
    """(base + delta, "") or ({}, why not): the server's update from a delta encoding (topk,
    int8_delta, int4_delta).

    ``base`` is the update's cluster model of its round as the robots decoded it; None when the
    server sent no such model (an unknown cluster, or a round it no longer serves)."""
    if base is None:
        return {}, f"delta against cluster {cluster_id}, whose model this round was not sent"
    if set(base) != set(delta):
        return {}, "delta tensors differ from the cluster model's"
    out = {}
    for name, d in delta.items():
        b = np.asarray(base[name], dtype=np.float32)
        if b.shape != np.shape(d):
            return {}, f"tensor {name!r}: delta shape {np.shape(d)} != model shape {b.shape}"
        out[name] = b + np.asarray(d, dtype=np.float32)
    return out, ""


class ErrorFeedback:
    """A robot's memory of what top-k left out (Stich et al.'s error feedback).

    ``delta_to_send(trained, start)`` is ``trained - start + residual``; after encoding it,
    ``keep_unsent(full, sent)`` stores ``full - sent`` as the next residual. The residual is
    saved atomically beside the robot's models (``path``), so a restarted robot keeps it, and is
    dropped when the model's tensors change (another policy) or a file is unreadable.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.residual: dict[str, NDArray[Any]] = {}
        if self.path is not None and self.path.exists():
            try:
                with np.load(self.path) as z:
                    self.residual = {k: z[k].astype(np.float32) for k in z.files}
            except (OSError, ValueError, EOFError, zipfile.BadZipFile):
                self.residual = {}  # a torn or foreign file: start without memory

    def _matches(self, model: Mapping[str, NDArray[Any]]) -> bool:
        return set(self.residual) == set(model) and all(
            self.residual[k].shape == np.shape(v) for k, v in model.items()
        )

    def delta_to_send(
        self, trained: Mapping[str, NDArray[Any]], start: Mapping[str, NDArray[Any]]
    ) -> dict[str, NDArray[Any]]:
        """This round's delta plus the residual of earlier rounds (float32)."""
        delta = {
            k: np.asarray(trained[k], np.float32) - np.asarray(start[k], np.float32)
            for k in trained
        }
        if self._matches(delta):
            for k in delta:
                delta[k] += self.residual[k]
        return delta

    def keep_unsent(
        self, full: Mapping[str, NDArray[Any]], sent: Mapping[str, NDArray[Any]]
    ) -> None:
        """Remember ``full - sent`` (what did not travel) for the next round, durably."""
        self.residual = {k: np.asarray(full[k], np.float32) - sent[k] for k in full}
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".npz.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **self.residual)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def norm(self) -> float:
        """L2 norm of the residual (diagnostics: how much is waiting to be sent)."""
        return float(math.sqrt(sum(float(np.sum(v * v)) for v in self.residual.values())))

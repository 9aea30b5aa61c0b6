"""The state the delta encodings keep: the robot's error feedback, and the server's rebuild of an
update from a delta (Stich et al., "Sparsified SGD with memory"; Lin et al., "Deep Gradient
Compression").

Every delta encoding (``topk``, ``int8_delta``, ``int4_delta``) sends ``trained - start +
residual``, where ``start`` is the cluster model the robot started from. What the encoding left
out (top-k's unsent entries, quantization's rounding error) is not lost: :class:`ErrorFeedback`
keeps it on the robot and adds it to the next round's delta. The server adds the decoded delta to
that round's model of the update's cluster as the robots decoded it (:func:`apply_delta`), so a
delta is only sent when the robot started from exactly one cluster model
(:func:`starts_from_one_cluster`).
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


def starts_from_one_cluster(membership: Sequence[tuple[int, float]], picked: bool) -> bool:
    """Whether a robot's start model is one cluster's model as sent (IFCA's pick, or a single
    cluster): only then can the server rebuild its update from a delta."""
    return picked or sum(1 for _, w in membership if w > 0) == 1


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

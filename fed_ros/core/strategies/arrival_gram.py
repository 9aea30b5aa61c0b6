"""CUA's Gram matrix built while a round's updates arrive, so that its close pays for the last few.

FedDRMan compares the robots' accumulated updates v_k = theta_k[Omega] - theta^0[Omega] by
their cosine similarity. Computed when the round closes (`aggregate.update_similarity`,
`streamed.omega_similarity`), that is K^2 |Omega| / 2 multiply-adds at the moment every robot
waits for its next model: 3.8 s of a 4.9 s round at K = 1000 (docs/core.md), while the rest of
the round grows with K. The dot products do not need the round to be over: each pair needs
only its two updates. :class:`ArrivalGram` keeps each admitted update's Omega sub-vector
(robots x |Omega| float32, the one thing here that grows with the fleet) and, every
``flush_every`` arrivals, computes the new rows against all earlier ones with one sgemm per
column chunk, accumulated in float64 over the same chunks as the batch path. When the round's
participants are known (``expected``), the pending rows are also computed as the last but one
arrives, so a round that every participant answers closes with one row to compute; one that
closes at quorum or its deadline computes the rows still pending (fewer than ``flush_every``).

The total work is the batch path's; it moves to the time the server is waiting for the rest of
the fleet. Batching the new rows keeps the products compute-bound: one arrival at a time would
be a matrix-vector product that re-reads every stored row per arrival (about 13x the batch
path's time at K = 1000, measured by `fed-ros bench aggregate`).

The Gram matrix equals the batch one up to float32 summation order inside each chunk's product
(relative 1e-6; `test_core_arrival_gram`): BLAS orders a matrix-matrix product's sums
differently for different shapes, so it is not bit-equal. CUA's partition is compared on the
same fleets in the tests; the cluster models do not depend on S beyond it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.params import Manifest

# Arrivals computed together: a (new, |Omega|) x (stored, |Omega|)^T product per column chunk is
# compute-bound from about 16 new rows (each stored float is used 16 times per read).
FLUSH_EVERY = 16
# Columns per product, summed in float64 across chunks (the batch path's scheme): 16 new rows of
# 4096 floats (256 KB) stay in cache while the stored rows stream past.
CHUNK = 4096


class ArrivalGram:
    """The Gram matrix of one round's Omega sub-vectors, one block of rows per flush."""

    def __init__(
        self,
        manifest: Manifest,
        names: Sequence[str],
        origin: Mapping[str, NDArray[Any]],
        capacity: int = 64,
        flush_every: int = FLUSH_EVERY,
        expected: int = 0,
    ) -> None:
        wanted = set(names)
        self._names = [s.name for s in manifest if s.name in wanted]
        self._origin = self._concat(origin)
        self.width = int(self._origin.size)
        self.flush_every = max(1, int(flush_every))
        self.expected = int(expected)  # the round's participants (0: not known)
        self._rows = np.empty((max(1, int(capacity)), self.width), dtype=np.float32)
        self._gram = np.zeros((self._rows.shape[0],) * 2, dtype=np.float64)
        self._count = 0  # rows whose Gram entries are computed
        self._pending: list[int] = []  # rows stored, not yet multiplied
        self._row_of: dict[str, int] = {}  # robot id -> its latest row

    def _concat(self, params: Mapping[str, NDArray[Any]]) -> NDArray[Any]:
        return np.concatenate(
            [np.asarray(params[n], dtype=np.float32).reshape(-1) for n in self._names]
            or [np.zeros(0, np.float32)]
        )

    def __len__(self) -> int:
        return len(self._row_of)

    @property
    def pending(self) -> int:
        """Rows stored whose Gram entries are not computed yet."""
        return len(self._pending)

    def _grow(self, rows: int) -> None:
        cap = self._rows.shape[0]
        if rows <= cap:
            return
        new_cap = max(rows, 2 * cap)
        grown = np.empty((new_cap, self.width), dtype=np.float32)
        grown[: self._count + len(self._pending)] = self._rows[: self._count + len(self._pending)]
        self._rows = grown
        gram = np.zeros((new_cap, new_cap), dtype=np.float64)
        gram[: self._count, : self._count] = self._gram[: self._count, : self._count]
        self._gram = gram

    def add(self, robot_id: str, params: Mapping[str, NDArray[Any]]) -> None:
        """Store ``robot_id``'s update (its Omega sub-vector minus the origin); a second update
        of the same robot replaces the first in :meth:`gram`."""
        row = self._count + len(self._pending)
        self._grow(row + 1)
        np.subtract(self._concat(params), self._origin, out=self._rows[row])
        self._pending.append(row)
        self._row_of[robot_id] = row
        if len(self._pending) >= self.flush_every or len(self._row_of) == self.expected - 1:
            self.flush()

    def flush(self) -> None:
        """Compute the Gram entries of the pending rows (against every earlier row and each
        other)."""
        if not self._pending:
            return
        lo, hi = self._count, self._count + len(self._pending)
        block = np.zeros((hi - lo, hi), dtype=np.float64)
        for a in range(0, self.width, CHUNK):
            b = min(a + CHUNK, self.width)
            block += self._rows[lo:hi, a:b] @ self._rows[:hi, a:b].T
        # The new rows' products with each other come from one general product, which need not
        # be symmetric to the last bit: keep its lower triangle, mirrored.
        own = block[:, lo:hi]
        block[:, lo:hi] = np.tril(own) + np.tril(own, -1).T
        self._gram[lo:hi, :hi] = block
        self._gram[:hi, lo:hi] = block.T
        self._count = hi
        self._pending = []

    def rows_for(self, robot_ids: Sequence[str]) -> list[int | None]:
        """Each robot's stored row (None: never added)."""
        return [self._row_of.get(r) for r in robot_ids]

    def gram(self, robot_ids: Sequence[str]) -> NDArray[Any]:
        """The (K, K) float64 Gram matrix of these robots' latest updates, in this order;
        KeyError naming a robot that was never added."""
        missing = [r for r in robot_ids if r not in self._row_of]
        if missing:
            raise KeyError(f"no update stored for {missing[:5]}")
        self.flush()
        idx = np.asarray([self._row_of[r] for r in robot_ids], dtype=np.int64)
        out: NDArray[Any] = self._gram[np.ix_(idx, idx)]
        return out

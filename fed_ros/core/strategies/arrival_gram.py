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

import threading
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
    """The Gram matrix of one round's Omega sub-vectors, one block of rows per cut.

    Where a block ends (a *cut*) depends only on the arrivals: every ``flush_every`` rows, and
    at the last but one expected participant. With ``background`` the blocks are multiplied by
    a worker thread (numpy's products release the GIL, so admission goes on beside them);
    without it, in the caller as each cut is made. Both compute the same blocks in the same
    order, so the Gram matrix is the same to the bit; :meth:`gram` waits for the worker and
    multiplies the rows after the last cut itself.
    """

    def __init__(
        self,
        manifest: Manifest,
        names: Sequence[str],
        origin: Mapping[str, NDArray[Any]],
        capacity: int = 64,
        flush_every: int = FLUSH_EVERY,
        expected: int = 0,
        background: bool = False,
    ) -> None:
        wanted = set(names)
        self._names = [s.name for s in manifest if s.name in wanted]
        self._origin = self._concat(origin)
        self.width = int(self._origin.size)
        self.flush_every = max(1, int(flush_every))
        self.expected = int(expected)  # the round's participants (0: not known)
        self._rows = np.empty((max(1, int(capacity)), self.width), dtype=np.float32)
        self._gram = np.zeros((self._rows.shape[0],) * 2, dtype=np.float64)
        self._stored = 0  # rows written
        self._count = 0  # rows whose Gram entries are computed
        self._cuts: list[int] = []  # block ends due, not yet multiplied (ascending)
        self._last_cut = 0
        self._row_of: dict[str, int] = {}  # robot id -> its latest row
        # Guards everything above against the worker; the worker's product itself runs
        # outside it, on rows that no longer change (a row is written once).
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._work, name="arrival-gram", daemon=True)
            self._thread.start()

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
        with self._cond:
            return self._stored - self._count

    def _grow_locked(self, rows: int) -> None:
        cap = self._rows.shape[0]
        if rows <= cap:
            return
        while self._busy:  # the worker reads the arrays; replace them only when it is idle
            self._cond.wait()
        new_cap = max(rows, 2 * cap)
        grown = np.empty((new_cap, self.width), dtype=np.float32)
        grown[: self._stored] = self._rows[: self._stored]
        self._rows = grown
        gram = np.zeros((new_cap, new_cap), dtype=np.float64)
        gram[: self._count, : self._count] = self._gram[: self._count, : self._count]
        self._gram = gram

    def add(self, robot_id: str, params: Mapping[str, NDArray[Any]]) -> None:
        """Store ``robot_id``'s update (its Omega sub-vector minus the origin); a second update
        of the same robot replaces the first in :meth:`gram`."""
        vector = self._concat(params)
        with self._cond:
            row = self._stored
            self._grow_locked(row + 1)
            np.subtract(vector, self._origin, out=self._rows[row])
            self._stored = row + 1
            self._row_of[robot_id] = row
            # Measured from the last cut made, never from the rows computed so far: the worker
            # may be inside a block, and the cuts must not depend on how far it got.
            if (
                self._stored - self._last_cut >= self.flush_every
                or len(self._row_of) == self.expected - 1
            ):
                self._cuts.append(self._stored)
                self._last_cut = self._stored
                if self._thread is not None:
                    self._cond.notify_all()
                else:
                    self._multiply_due_locked()

    def _block(self, rows: NDArray[Any], lo: int, hi: int) -> NDArray[Any]:
        """Gram rows lo..hi against rows 0..hi (float64, the own square made symmetric)."""
        block = np.zeros((hi - lo, hi), dtype=np.float64)
        for a in range(0, self.width, CHUNK):
            b = min(a + CHUNK, self.width)
            block += rows[lo:hi, a:b] @ rows[:hi, a:b].T
        # The new rows' products with each other come from one general product, which need not
        # be symmetric to the last bit: keep its lower triangle, mirrored.
        own = block[:, lo:hi]
        block[:, lo:hi] = np.tril(own) + np.tril(own, -1).T
        return block

    def _store_locked(self, lo: int, hi: int, block: NDArray[Any]) -> None:
        self._gram[lo:hi, :hi] = block
        self._gram[:hi, lo:hi] = block.T
        self._count = hi

    def _multiply_due_locked(self) -> None:
        while self._cuts:
            hi = self._cuts.pop(0)
            lo = self._count
            self._store_locked(lo, hi, self._block(self._rows, lo, hi))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._cuts:
                    self._cond.wait()
                if self._closed:
                    return
                hi, lo, rows = self._cuts.pop(0), self._count, self._rows
                self._busy = True
            block = None
            try:
                block = self._block(rows, lo, hi)
            finally:
                # Stored and marked idle at once: no flush may see the rows as neither pending
                # nor computed. (A failed block leaves its rows to the close's last block.)
                with self._cond:
                    if block is not None:
                        self._store_locked(lo, hi, block)
                    self._busy = False
                    self._cond.notify_all()

    def flush(self) -> None:
        """Compute the Gram entries of every stored row (waits for the worker's blocks)."""
        with self._cond:
            while self._busy:
                self._cond.wait()
            if self._stored > self._last_cut:
                self._cuts.append(self._stored)
                self._last_cut = self._stored
            self._multiply_due_locked()

    def close(self) -> None:
        """Stop the worker (it finishes the block it is on); the matrix stays readable."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def rows_for(self, robot_ids: Sequence[str]) -> list[int | None]:
        """Each robot's stored row (None: never added)."""
        with self._cond:
            return [self._row_of.get(r) for r in robot_ids]

    def gram(self, robot_ids: Sequence[str]) -> NDArray[Any]:
        """The (K, K) float64 Gram matrix of these robots' latest updates, in this order;
        KeyError naming a robot that was never added."""
        with self._cond:
            missing = [r for r in robot_ids if r not in self._row_of]
        if missing:
            raise KeyError(f"no update stored for {missing[:5]}")
        self.flush()
        with self._cond:
            idx = np.asarray([self._row_of[r] for r in robot_ids], dtype=np.int64)
            out: NDArray[Any] = self._gram[np.ix_(idx, idx)]
        return out

"""A round's accepted updates in a memory-mapped spill file instead of the server's heap.

Holding K decoded models in memory makes the server's memory grow with robots x parameters
(44 GB for 1000 robots of an 11M-parameter policy). The server copies each accepted update
into a row of an :class:`UpdateSpill` (an ``np.memmap`` file) and keeps only row views; the
strategies read those rows block by block when the round closes
(:mod:`fed_ros.core.strategies.streamed`), so the heap holds C cluster models and one block.
The rows are page cache: the kernel writes them back and drops them under memory pressure
instead of the server being killed.

Bounds: one spill holds at most ``capacity`` rows (the round's participants: a robot's
update is accepted once per round), i.e. capacity x P x 4 bytes of disk, allocated only as
rows are written (a sparse file). The file is unlinked as soon as it is mapped: its space is
freed when the last view of its rows goes (a finished round, or a crash), so nothing is left
to clean up. The directory is the server's own (``<state_dir>/spill``).

Resident size: a row's pages stay mapped into the server (and count in its RSS) from the
moment they are written or read until :meth:`UpdateSpill.release` unmaps them. At 1000 robots x
an 11M-parameter policy that was 20 GB of RSS over a 3.6 GB heap. ``release`` is
``madvise(MADV_DONTNEED)`` on the shared file mapping: the data stays in the file's page cache
(written back as the kernel sees fit) and a later read maps it again, so a caller that releases
every second (the server node's ``spill_release_s`` timer) bounds the rows' share of the RSS to
what is written or read within a second.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from fed_ros.core.params import Manifest, StateDict, check_manifest, flatten, num_params, unflatten


# madvise(2) through ctypes, which releases the GIL for the call (mmap.madvise holds it), so
# unmapping gigabytes does not stall the server's other threads. Linux's MADV_DONTNEED.
MADV_DONTNEED = 4


def _load_madvise() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _load_madvise()


class UpdateSpill:
    """(capacity, P) float32 rows in an unlinked memory-mapped file; `add` returns row views."""

    def __init__(self, manifest: Manifest, capacity: int, directory: str | Path) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"UpdateSpill capacity must be an int >= 1, got {capacity!r}")
        self.manifest = tuple(manifest)
        P = num_params(self.manifest)
        if P < 1:
            raise ValueError("UpdateSpill needs a manifest with at least one parameter")
        Path(directory).mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="updates-", suffix=".f32", dir=directory)
        os.close(fd)
        try:
            self.data = np.memmap(path, dtype=np.float32, mode="w+", shape=(capacity, P))
        finally:
            # Mapped (or failed): the name goes now, the pages stay while a view holds them.
            os.unlink(path)
        # A plain ndarray over the mapping: the views handed out have it as their base, so
        # code that recognises rows of one (R, P) array (params.shared_buffer_rows) does here.
        self.rows = np.asarray(self.data)
        self._used = 0

    @property
    def capacity(self) -> int:
        """Rows the spill holds."""
        return int(self.data.shape[0])

    def __len__(self) -> int:
        return self._used

    def add(self, sd: Mapping[str, np.ndarray]) -> StateDict:
        """Copy a state dict into the next row (after checking its manifest); its views."""
        if self._used >= self.capacity:
            raise ValueError(f"UpdateSpill full (capacity {self.capacity} updates)")
        check_manifest(sd, self.manifest)
        row = self.rows[self._used]
        flatten(sd, out=row)
        self._used += 1
        return unflatten(row, self.manifest)

    def release(self) -> bool:
        """Unmap every row's pages from this process (RSS), keeping their data: the mapping is
        shared and file-backed, so the next read maps the same bytes again from the page cache.
        Safe beside concurrent reads and writes of the rows (they fault the pages back in).
        False where the platform has no madvise (nothing is done there)."""
        if _MADVISE is None:
            return False
        address = self.rows.__array_interface__["data"][0]  # the mapping's start: page-aligned
        if _MADVISE(address, self.rows.nbytes, MADV_DONTNEED) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise(MADV_DONTNEED) of the update spill: {os.strerror(err)}")
        return True


class RoundSpills:
    """The server's spill for the TRAIN stage now open; earlier ones live while views do."""

    def __init__(self, manifest: Manifest, directory: str | Path) -> None:
        self.manifest = tuple(manifest)
        self.directory = Path(directory)
        self.current: UpdateSpill | None = None

    def open(self, capacity: int) -> None:
        """A fresh spill for a new TRAIN stage of ``capacity`` participants."""
        self.current = UpdateSpill(self.manifest, max(1, int(capacity)), self.directory)

    def release(self) -> None:
        """Unmap the open spill's pages (:meth:`UpdateSpill.release`); earlier stages' spills are
        left as they are (only buffered rounds keep them, for a few stale updates)."""
        spill = self.current  # a strong reference: the mapping outlives the call
        if spill is not None:
            spill.release()

    def hold(self, params: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """The update's tensors moved into the open spill (views), or as given when none is
        open or it is full (a robot's later attempt; kept in memory then, never dropped)."""
        spill = self.current
        if spill is None or len(spill) >= spill.capacity:
            return params
        try:
            return spill.add(params)
        except ValueError:
            # A manifest the receiver let through: kept as given, so the strategy's own check
            # refuses it by name when the round is aggregated; the spill takes no row for it.
            return params

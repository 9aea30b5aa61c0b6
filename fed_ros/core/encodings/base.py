"""What every update and model encoding offers: the one interface the wire, the checks and the
benchmarks call (issue 38 item 3).

An encoding turns a state dict's tensors (float32, manifest order) into one payload of bytes
plus, for ``int8`` only, one float32 scale per tensor that travels beside the payload. Its
receiver knows the manifest before any byte arrives, so an encoding also says which payload
sizes a manifest allows (:meth:`Encoding.size_range`, checked before a chunk is buffered) and
how many scales travel beside it (:meth:`Encoding.scale_count`). Decoding refuses anything
malformed with a ValueError naming the tensor: a hostile payload is rejected, never half-applied.

A *delta* encoding sends the change against the cluster model the robot started from, with the
robot's error feedback (:mod:`fed_ros.core.encodings.feedback`); it is for updates only, and the
server adds the decoded delta to that round's model of the update's cluster.
"""

from __future__ import annotations

from typing import Any

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

StateDict = dict[str, NDArray[Any]]


def numel(shape: Sequence[int]) -> int:
    """Values of a tensor of ``shape``; Python ints, so a hostile shape cannot overflow into a
    small allocation."""
    return math.prod(int(d) for d in shape)


class Encoding:
    """One encoding: its name, its wire id (``TensorPayload.ENCODING_*``) and its codec.

    Subclasses set the class attributes and implement :meth:`size_range`, :meth:`encode` and
    :meth:`decode`; the rest follows from those."""

    name: str = ""
    wire_id: int = -1
    # A change against the start model (updates only; the robot keeps error feedback).
    delta: bool = False
    # Nominal wire bytes per value (before deflate, without scales or indices), for estimates.
    bytes_per_value: float = 4.0

    def size_range(self, sizes: Sequence[int]) -> tuple[int, int]:
        """(smallest, largest) payload bytes for tensors of these value counts; one size where
        the encoding's size does not depend on the values."""
        raise NotImplementedError

    def scale_count(self, tensors: int) -> int:
        """float32 scales that travel beside the payload (``TensorPayload.scales``)."""
        return 0

    def encode(self, sd: Mapping[str, NDArray[Any]]) -> tuple[NDArray[Any], NDArray[Any]]:
        """(payload uint8, C-contiguous; scales float32) of ``sd``'s tensors in order;
        ValueError naming a tensor the encoding cannot carry (not finite, out of range)."""
        raise NotImplementedError

    def decode(
        self, buf: NDArray[Any], sizes: Sequence[int], names: Sequence[str], scales: NDArray[Any]
    ) -> list[NDArray[Any]]:
        """Flat float32 values of every tensor (``buf``: uint8 payload whose size the caller
        checked against :meth:`size_range`); ValueError naming what is malformed. Dense
        encodings may return views over ``buf``."""
        raise NotImplementedError

    def with_fraction(self, fraction: float) -> Encoding:
        """This encoding keeping ``fraction`` of each tensor (the sparse ones); the others have
        no such option and return themselves."""
        return self

    def roundtrip(self, sd: Mapping[str, NDArray[Any]]) -> StateDict:
        """What a receiver decodes of ``sd`` (float32 copies, ``sd``'s shapes): the in-process
        benchmarks charge an encoding's error with it, without a wire."""
        arrays = {k: np.asarray(v, np.float32) for k, v in sd.items()}
        payload, scales = self.encode(arrays)
        flat = self.decode(payload, [v.size for v in arrays.values()], list(arrays), scales)
        return {
            k: np.array(f, np.float32).reshape(v.shape) for (k, v), f in zip(arrays.items(), flat)
        }

    def nbytes(self, sd: Mapping[str, NDArray[Any]]) -> int:
        """Wire bytes of ``sd``: the payload plus the scales beside it (4 bytes each)."""
        sizes = [int(np.asarray(v).size) for v in sd.values()]
        lo, hi = self.size_range(sizes)
        if lo == hi:
            return lo + 4 * self.scale_count(len(sizes))
        payload, scales = self.encode(sd)
        return int(payload.nbytes) + 4 * int(scales.size)

    def __repr__(self) -> str:
        return f"<encoding {self.name} (wire id {self.wire_id})>"


def no_scales() -> NDArray[Any]:
    """The empty scales of every encoding but ``int8``."""
    return np.zeros(0, np.float32)

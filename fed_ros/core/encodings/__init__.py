"""The registry of update and model encodings (issue 38 item 3).

Each encoding is one module of this package: its wire id (``TensorPayload.ENCODING_*``), its
codec, the payload sizes a manifest allows (what a receiver checks before buffering a byte),
the scales that travel beside it, and, for the delta encodings, the error-feedback state
(:mod:`.feedback`). This module lists them once: a new encoding is one module and one entry in
:data:`REGISTRY`, plus its id constant in ``msg/TensorPayload.msg``, which a test holds equal to
the entry's.

Everything else asks here: the wire format (``fed_ros.ros.wire.tensors``), the admission checks
(``fed_ros.core.checks``), the parameter choices of a fleet file, and the benchmarks, which charge
an encoding's error in process with :func:`roundtrip`.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Mapping

from numpy.typing import NDArray

from fed_ros.core.encodings.base import Encoding, StateDict
from fed_ros.core.encodings.blockwise import Int4Block, Int8Block
from fed_ros.core.encodings.dense import Float16, Float32, Int8
from fed_ros.core.encodings.quantized_delta import Int4Delta, Int8Delta
from fed_ros.core.encodings.topk import TopK, parse_topk

FLOAT32 = Float32()

# Wire-id order. A cluster model travels under a whole-model encoding only; an update under any.
REGISTRY: tuple[Encoding, ...] = (
    FLOAT32,
    Float16(),
    Int8(),
    Int8Block(),
    TopK(),
    Int4Block(),
    Int8Delta(),
    Int4Delta(),
)
BY_NAME: dict[str, Encoding] = {e.name: e for e in REGISTRY}
BY_WIRE_ID: dict[int, Encoding] = {e.wire_id: e for e in REGISTRY}
# Whole-model encodings, then the delta ones (the order the parameter choices list them in).
MODEL_ENCODINGS: tuple[str, ...] = tuple(e.name for e in REGISTRY if not e.delta)
DELTA_ENCODINGS: tuple[str, ...] = tuple(e.name for e in REGISTRY if e.delta)
UPDATE_ENCODINGS: tuple[str, ...] = MODEL_ENCODINGS + DELTA_ENCODINGS
DELTA_WIRE_IDS: frozenset[int] = frozenset(e.wire_id for e in REGISTRY if e.delta)

if len(BY_NAME) != len(REGISTRY) or len(BY_WIRE_ID) != len(REGISTRY):
    raise RuntimeError("two registered encodings share a name or a wire id")


def resolve(name: str) -> Encoding:
    """The encoding called ``name``; ``topk:<fraction>`` names top-k with that fraction.
    ValueError naming ``name`` and the choices."""
    fraction = parse_topk(name) if isinstance(name, str) else None
    if fraction is not None:
        return BY_NAME["topk"].with_fraction(fraction)
    if name not in BY_NAME:
        raise ValueError(f"unknown encoding {name!r}; expected one of {list(UPDATE_ENCODINGS)}")
    return BY_NAME[name]


def model_encoding(name: str) -> Encoding:
    """The whole-model encoding called ``name`` (what a cluster model may travel as);
    ValueError naming it, and saying so when it is a delta encoding."""
    if name not in MODEL_ENCODINGS:
        hint = " (a delta encoding is for updates only)" if name in DELTA_ENCODINGS else ""
        raise ValueError(
            f"unknown model encoding {name!r}; expected one of {list(MODEL_ENCODINGS)}{hint}"
        )
    return BY_NAME[name]


def by_wire_id(wire_id: int) -> Encoding:
    """The encoding of a ``TensorPayload.encoding`` value; ValueError naming an unknown id."""
    try:
        return BY_WIRE_ID[wire_id]
    except (KeyError, TypeError):
        raise ValueError(f"unknown payload encoding {wire_id!r}") from None


def is_delta(name: str) -> bool:
    """Whether an update encoding sends a delta against the start model (the robot keeps error
    feedback, the server adds the delta to the round's cluster model); False for unknown names,
    ValueError for a top-k name whose fraction is not in (0, 1]."""
    if parse_topk(name) is not None:
        return True
    return name in BY_NAME and BY_NAME[name].delta


def roundtrip(sd: Mapping[str, NDArray[Any]], name: str) -> StateDict:
    """What a receiver decodes of ``sd`` sent under ``name`` (float32 copies)."""
    return resolve(name).roundtrip(sd)


def encoded_nbytes(sd: Mapping[str, NDArray[Any]], name: str) -> int:
    """Wire bytes of ``sd`` under ``name`` (int8's per-tensor scales included: 4 each)."""
    return resolve(name).nbytes(sd)


__all__ = [
    "BY_NAME",
    "BY_WIRE_ID",
    "DELTA_ENCODINGS",
    "DELTA_WIRE_IDS",
    "Encoding",
    "FLOAT32",
    "MODEL_ENCODINGS",
    "REGISTRY",
    "UPDATE_ENCODINGS",
    "by_wire_id",
    "encoded_nbytes",
    "is_delta",
    "model_encoding",
    "resolve",
    "roundtrip",
]

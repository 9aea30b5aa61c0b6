"""What the benchmark's robots and server exchange, charged as a fleet's wire would charge it.

Cluster models travel under the model encoding (robots start from the decoded models), updates
under the update encoding (the server aggregates what it decodes), and every payload's bytes are
counted. A benchmark encoding is ``UPDATE[/MODEL]``: ``int8_block`` for both, or
``int4_block/float32`` for 4-bit updates and exact models. ``topk[:fraction]`` updates are
sparse deltas against the start model with each robot's error feedback, exactly as
`fed_ros.ros.nodes.robot.update_encoding` sends them and the server node rebuilds them;
``int8_delta``/``int4_delta`` updates are that delta quantized and deflated, with the same error
feedback. A delta robot that started from a mix of clusters sends float32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fed_ros.core import encodings
from fed_ros.core.encodings.feedback import apply_delta, starts_from_one_cluster

StateDict = dict[str, np.ndarray]


def split_encoding(encoding: str) -> tuple[str, str]:
    """(update encoding, model encoding) of a benchmark encoding ``UPDATE[/MODEL]``: one name
    for both, except that the delta encodings are for updates only (their models travel as
    float32 unless named)."""
    update, _, model = str(encoding).partition("/")
    if not model:
        model = "float32" if encodings.is_delta(update) else update
    return update, model


def check_bench_encoding(encoding: str) -> str:
    """``encoding`` if both its parts are known, else ValueError naming the unknown part."""
    update, model = split_encoding(encoding)
    encodings.resolve(update)
    if model not in encodings.MODEL_ENCODINGS:
        raise ValueError(
            f"unknown model encoding {model!r} in {encoding!r}; expected one of "
            f"{list(encodings.MODEL_ENCODINGS)} (the delta encodings are for updates only)"
        )
    return encoding


def encoding_suffix(encoding: str) -> str:
    """The encoding as it appears in cell file and run names (no ':' or '/')."""
    return encoding.replace(":", "-").replace("/", "+")


def model_encoding(encoding: str) -> str:
    """How cluster models travel under a benchmark encoding."""
    return split_encoding(encoding)[1]


def send_update(
    trained: Mapping[str, np.ndarray],
    start: Mapping[str, np.ndarray],
    cluster_id: int,
    membership: Sequence[tuple[int, float]],
    picked: bool,
    encoding: str,
    feedback: Any,
) -> tuple[StateDict, int]:
    """(the update the server decodes, its payload bytes). ``feedback`` is this robot's
    `ErrorFeedback` (used, and updated, under the delta encodings only)."""
    update_encoding = split_encoding(encoding)[0]
    enc = encodings.resolve(update_encoding)
    if enc.delta and starts_from_one_cluster(membership, picked):
        full = feedback.delta_to_send(trained, start)
        sent = enc.roundtrip(full)
        nbytes = enc.nbytes(full)
        feedback.keep_unsent(full, sent)
        received, why = apply_delta(start, sent, cluster_id)
        if why:
            raise ValueError(why)
        return received, nbytes
    dense = encodings.FLOAT32 if enc.delta else enc  # a delta robot's fallback
    return dense.roundtrip(trained), dense.nbytes(trained)

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

from fed_ros.core import quantized_deltas, sparse_deltas
from fed_ros.core.compression import ENCODING_NAMES, check_encoding, encoded_nbytes, roundtrip
from fed_ros.core.quantized_deltas import is_delta_encoding

StateDict = dict[str, np.ndarray]


def split_encoding(encoding: str) -> tuple[str, str]:
    """(update encoding, model encoding) of a benchmark encoding ``UPDATE[/MODEL]``: one name
    for both, except that the delta encodings are for updates only (their models travel as
    float32 unless named)."""
    update, _, model = str(encoding).partition("/")
    if not model:
        model = "float32" if is_delta_encoding(update) else update
    return update, model


def check_bench_encoding(encoding: str) -> str:
    """``encoding`` if both its parts are known, else ValueError naming the unknown part."""
    update, model = split_encoding(encoding)
    if not is_delta_encoding(update):
        check_encoding(update)
    if model not in ENCODING_NAMES:
        raise ValueError(
            f"unknown model encoding {model!r} in {encoding!r}; expected one of "
            f"{list(ENCODING_NAMES)} (the delta encodings are for updates only)"
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
    update_encoding, model_enc = split_encoding(encoding)
    delta = is_delta_encoding(update_encoding)
    if delta and sparse_deltas.starts_from_one_cluster(membership, picked):
        full = feedback.delta_to_send(trained, start)
        fraction = sparse_deltas.parse_topk(update_encoding)
        if fraction is not None:
            sent = sparse_deltas.roundtrip(full, fraction)
            nbytes = sparse_deltas.payload_nbytes([v.size for v in full.values()], fraction)
        else:
            sent = quantized_deltas.roundtrip(full, update_encoding)
            nbytes = quantized_deltas.payload_nbytes(full, update_encoding)
        feedback.keep_unsent(full, sent)
        received, why = sparse_deltas.apply_delta(start, sent, cluster_id)
        if why:
            raise ValueError(why)
        return received, nbytes
    dense = "float32" if delta else update_encoding  # a delta robot's fallback
    return roundtrip(trained, dense), encoded_nbytes(trained, dense)

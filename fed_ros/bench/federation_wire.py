"""What the benchmark's robots and server exchange, charged as a fleet's wire would charge it.

Cluster models travel under the model encoding (robots start from the decoded models), updates
under the update encoding (the server aggregates what it decodes), and every payload's bytes are
counted. ``topk[:fraction]`` updates are sparse deltas against the start model with each
robot's error feedback, exactly as `fed_ros.ros.nodes.robot_update_encoding` sends them and the
server node rebuilds them; a topk robot that started from a mix of clusters sends float32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fed_ros.core import sparse_deltas
from fed_ros.core.compression import encoded_nbytes, roundtrip

StateDict = dict[str, np.ndarray]


def model_encoding(encoding: str) -> str:
    """How cluster models travel under a benchmark encoding (topk is for updates only)."""
    return "float32" if sparse_deltas.parse_topk(encoding) is not None else encoding


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
    `ErrorFeedback` (used, and updated, under topk only)."""
    fraction = sparse_deltas.parse_topk(encoding)
    if fraction is not None and sparse_deltas.starts_from_one_cluster(membership, picked):
        full = feedback.delta_to_send(trained, start)
        sent = sparse_deltas.roundtrip(full, fraction)
        feedback.keep_unsent(full, sent)
        received, why = sparse_deltas.apply_delta(start, sent, cluster_id)
        if why:
            raise ValueError(why)
        return received, sparse_deltas.payload_nbytes([v.size for v in full.values()], fraction)
    dense = model_encoding(encoding)
    return roundtrip(trained, dense), encoded_nbytes(trained, dense)

"""How a robot packs its trained update for the wire (`update_encoding`), deltas included.

The dense encodings pack the trained model itself. The delta encodings (``topk``, ``int8_delta``,
``int4_delta``) pack the change against the cluster model the robot started from, plus what
earlier rounds left out: top-k's unsent entries or quantization's rounding error (error feedback,
`fed_ros.core.encodings.feedback.ErrorFeedback`, kept in ``model_dir`` across restarts). The server
rebuilds the update from that round's model of the update's cluster, so a delta is only sent
when the robot started from exactly one cluster model; a robot that started from a weighted
mean of several (soft memberships) sends that round's update as float32 and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.core.encodings import is_delta
from fed_ros.core.encodings.feedback import ErrorFeedback
from fed_ros.ros.wire.tensors import EncodedPayload, decode_state_dict, encode_state_dict

# The name predates the quantized deltas; their rounding error is kept in the same memory (a
# robot that changes delta encoding carries what is still unsent over).
RESIDUAL_FILE = "topk_residual.npz"


class UpdateEncoder:
    """Encodes each round's update under the robot's live ``update_encoding``."""

    def __init__(self, model_dir: Path, log: Any) -> None:
        self.feedback = ErrorFeedback(Path(model_dir) / RESIDUAL_FILE)
        self.log = log

    def encode(
        self,
        trained: Mapping[str, np.ndarray],
        start: Mapping[str, np.ndarray],
        one_cluster: bool,
        params: Any,
    ) -> EncodedPayload:
        """The update's payload: ``trained`` dense, or its delta against ``start``."""
        encoding = params.update_encoding
        if not is_delta(encoding):
            return encode_state_dict(trained, encoding)
        if not one_cluster:
            self.log.warn(
                f"update_encoding {encoding} needs a start from one cluster model; this round's "
                "start is a mix of several, so its update goes as float32",
                throttle_duration_sec=60.0,
            )
            return encode_state_dict(trained, "float32")
        full = self.feedback.delta_to_send(trained, start)
        encoded = encode_state_dict(full, encoding, topk_fraction=params.update_topk_fraction)
        sent = decode_state_dict(encoded.manifest, encoded.encoding, encoded.data, copy=True)
        self.feedback.keep_unsent(full, sent)
        return encoded

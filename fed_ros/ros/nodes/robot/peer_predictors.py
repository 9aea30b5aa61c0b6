"""The peers' RND predictors a robot keeps between the DESCRIBE and SCORE stages.

In RND clustering each robot scores every other participant's predictor on its own data
(the SCORE stage). Anyone on the DDS domain can publish a descriptor and only the server checks
signatures, so what a robot keeps is bounded: RND predictors of participants of the current
round (or of the next, which may arrive before its announcement), at most MAX_PREDICTOR_BYTES
each and MAX_PEER_PREDICTORS in all; older rounds' are dropped as a new round begins.
"""

from __future__ import annotations

from typing import Any

from fed_ros.msg import ClientDescriptor as DescriptorMsg

MAX_PREDICTOR_BYTES = 16 << 20
MAX_PEER_PREDICTORS = 256


def keep_peer_predictor(
    store: dict[tuple[int, str], bytes], msg: Any, ann: Any, own_id: str
) -> None:
    """Add ``msg``'s predictor to ``store`` ((round, robot) -> bytes) if it is one to keep;
    ``ann`` is the newest announcement (None: none yet)."""
    rid, round_idx = str(msg.robot_id), int(msg.round)
    if (
        int(msg.kind) != DescriptorMsg.KIND_RND
        or not len(msg.payload)
        or len(msg.payload) > MAX_PREDICTOR_BYTES
        or len(rid) > 256
        or rid == own_id
    ):
        return
    if ann is not None:
        if not ann.round_idx <= round_idx <= ann.round_idx + 1:
            return
        if round_idx == ann.round_idx and rid not in ann.participants:
            return
        for key in [k for k in store if k[0] < ann.round_idx]:
            del store[key]
    if (round_idx, rid) not in store and len(store) >= MAX_PEER_PREDICTORS:
        return
    store[(round_idx, rid)] = bytes(msg.payload)

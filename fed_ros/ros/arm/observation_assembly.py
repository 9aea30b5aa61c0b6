"""Observation assembly: one control tick's messages, arriving separately, joined into the
observation dict a policy sees.

An arm publishes each part of an observation (images, joint and gripper states, end-effector
pose, object state) on its own topic, all stamped with the tick's stamp (the synchronisation
rule of :mod:`fed_ros.ros.arm.topics`). Joining them by stamp, and dropping ticks that lost a
best-effort sample, is a concept of its own: the topic names and message codecs stay in
``topics``; this module only says which parts make an observation and when one is complete.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from fed_ros.core.data.episode import (
    AGENTVIEW_IMAGE,
    EEF_POS,
    EEF_QUAT,
    GRIPPER_QPOS,
    JOINT_POS,
    OBJECT_STATE,
    WRIST_IMAGE,
)
from fed_ros.ros.arm.topics import (
    AGENTVIEW_TOPIC,
    EEF_POSE_TOPIC,
    GRIPPER_STATE_TOPIC,
    JOINT_STATES_TOPIC,
    OBJECT_STATE_TOPIC,
    WRIST_TOPIC,
)

# Observation part -> topic carrying it (the assembler's and the recorder's vocabulary).
IMAGE_PARTS = {AGENTVIEW_IMAGE: AGENTVIEW_TOPIC, WRIST_IMAGE: WRIST_TOPIC}
STATE_PARTS = {
    "joint_states": JOINT_STATES_TOPIC,
    "gripper_state": GRIPPER_STATE_TOPIC,
    "eef_pose": EEF_POSE_TOPIC,
    OBJECT_STATE: OBJECT_STATE_TOPIC,
}


class ObservationAssembler:
    """Collects one tick's messages by stamp and yields the complete observation dict.

    Parts arrive on separate topics in any order; the observation of stamp ``s`` is
    complete when every required part with stamp ``s`` is in. Incomplete stamps older
    than ``history`` ticks are dropped (a lost best-effort sample).
    """

    def __init__(self, cameras: bool = True, history: int = 8) -> None:
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self.required = set(STATE_PARTS) | (set(IMAGE_PARTS) if cameras else set())
        self.history = history
        self._pending: OrderedDict[int, dict[str, object]] = OrderedDict()
        self._last_emitted = -1
        self.dropped = 0

    def add(self, part: str, stamp_ns: int, value: object) -> dict[str, np.ndarray] | None:
        """Add one decoded part; returns the observation when this completes it."""
        if part not in self.required:
            return None
        if stamp_ns <= self._last_emitted:
            return None  # late duplicate of an observation already handed out
        parts = self._pending.get(stamp_ns)
        if parts is None:
            parts = self._pending[stamp_ns] = {}
            while len(self._pending) > self.history:
                self._pending.popitem(last=False)
                self.dropped += 1
        parts[part] = value
        if len(parts) < len(self.required):
            return None
        del self._pending[stamp_ns]
        # Older incomplete stamps can never be used once a newer one is complete.
        for old in [s for s in self._pending if s < stamp_ns]:
            del self._pending[old]
            self.dropped += 1
        self._last_emitted = stamp_ns
        return observation_from_parts(parts)

    def clear(self) -> None:
        """Forget partial observations (after a reset)."""
        self._pending.clear()


def observation_from_parts(parts: dict[str, object]) -> dict[str, np.ndarray]:
    """Decoded messages of one tick -> observation dict with core/episode.py keys."""
    joint_pos, _ = parts["joint_states"]
    pos, quat = parts["eef_pose"]
    obs = {
        JOINT_POS: np.asarray(joint_pos, dtype=np.float32),
        GRIPPER_QPOS: np.asarray(parts["gripper_state"][0], dtype=np.float32),
        EEF_POS: np.asarray(pos, dtype=np.float32),
        EEF_QUAT: np.asarray(quat, dtype=np.float32),
        OBJECT_STATE: np.asarray(parts[OBJECT_STATE], dtype=np.float32),
    }
    # Images and any extra parts a caller registered (e.g. the episode status) pass through.
    for key, value in parts.items():
        if key not in STATE_PARTS:
            obs[key] = value
    return obs

"""Demonstration episodes: the contract between arms (sim or real), recording and learning.

An episode is a time-aligned set of observation arrays plus the commanded actions. It is
saved as an uncompressed ``.npz`` written with ``allow_pickle=False`` (no code runs on
load) next to the MCAP recording it came from, so training never re-decodes images.
"""

from __future__ import annotations

from typing import Any

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

# Actions are 4-D across every task family: normalised OSC end-effector position deltas
# (dx, dy, dz in [-1, 1]) and the gripper command (-1 open, 1 closed). One action space
# keeps every robot's policy on the same manifest, which federation requires.
ACTION_DIM = 4

# Low-dimensional object state is zero-padded to this fixed size for the same reason
# (Lift, PickPlaceCan and Stack expose different numbers of object features).
OBJECT_STATE_DIM = 32
# object_state layout (fed_ros.sim.envs.ArmEnv._object_state): per object OBJECT_STRIDE
# values, position (3), quaternion xyzw (4), eef->object vector (3), all in the base frame;
# task extras (Stack's cubeA->cubeB vector, PickPlaceCan's bin position) follow, then zeros.
OBJECT_STRIDE = 10
OBJECT_FIELDS = {"pos": slice(0, 3), "quat": slice(3, 7), "eef_to_obj": slice(7, 10)}
OBJECT_QUAT_SLOTS = tuple(
    i
    for i in range(OBJECT_STATE_DIM)
    if OBJECT_FIELDS["quat"].start <= i % OBJECT_STRIDE < OBJECT_FIELDS["quat"].stop
)

# Observation keys (shapes per time step). Images are HxWx3 uint8, upright (row 0 = top).
AGENTVIEW_IMAGE = "agentview_image"
WRIST_IMAGE = "wrist_image"
JOINT_POS = "joint_pos"  # (7,) float32, radians
GRIPPER_QPOS = "gripper_qpos"  # (2,) float32, finger joint positions (m)
EEF_POS = "eef_pos"  # (3,) float32, metres in the robot base frame
EEF_QUAT = "eef_quat"  # (4,) float32, xyzw
OBJECT_STATE = "object_state"  # (OBJECT_STATE_DIM,) float32, zero-padded

IMAGE_KEYS = (AGENTVIEW_IMAGE, WRIST_IMAGE)
LOWDIM_KEYS = (JOINT_POS, GRIPPER_QPOS, EEF_POS, EEF_QUAT, OBJECT_STATE)


@dataclass
class Episode:
    """One demonstration: observations[key] is (T, ...) and actions is (T, ACTION_DIM)."""

    task: str
    instruction: str
    observations: dict[str, NDArray[Any]]
    actions: NDArray[Any]
    variation: str = "default"
    robot_id: str = ""
    success: bool = True
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.actions = np.asarray(self.actions, dtype=np.float32)
        if self.actions.ndim != 2 or self.actions.shape[1] != ACTION_DIM:
            raise ValueError(f"actions must be (T, {ACTION_DIM}), got shape {self.actions.shape}")
        if not np.all(np.isfinite(self.actions)):
            raise ValueError(f"episode {self.task!r}: actions contain NaN/Inf")
        length = len(self.actions)
        if length == 0:
            raise ValueError(f"episode {self.task!r} has no steps")
        for key, value in self.observations.items():
            if len(value) != length:
                raise ValueError(
                    f"observation {key!r} has {len(value)} steps but actions have {length}"
                )

    def __len__(self) -> int:
        return len(self.actions)

    def save(self, path: str | Path) -> Path:
        """Write the episode as ``.npz`` (no pickle); returns the path written."""
        path = Path(path)
        meta = {
            "task": self.task,
            "instruction": self.instruction,
            "variation": self.variation,
            "robot_id": self.robot_id,
            "success": self.success,
            "metadata": self.metadata,
        }
        arrays = {f"obs/{k}": v for k, v in self.observations.items()}
        arrays["actions"] = self.actions
        arrays["meta_json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Episode":
        """Read an episode written by :meth:`save` (allow_pickle=False)."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta_json"]).decode())
            obs = {k[len("obs/") :]: data[k] for k in data.files if k.startswith("obs/")}
            actions = data["actions"]
        return cls(
            task=meta["task"],
            instruction=meta["instruction"],
            observations=obs,
            actions=actions,
            variation=meta.get("variation", "default"),
            robot_id=meta.get("robot_id", ""),
            success=bool(meta.get("success", True)),
            metadata=dict(meta.get("metadata", {})),
        )

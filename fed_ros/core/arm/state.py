"""The arm adapter's view of the arm's state: the newest sample of each part, when it came, its
stamp.

ROS-free. Parts are ``joints``, ``fingers``, ``pose``, ``object_state`` and one per camera. A
part is *fresh* when it came within ``state_timeout_s``. A tick acts on the *current* state: for a
free-running arm that is the fresh one (a stale state is no observation); a lockstep arm (a
simulator that steps only on an answer) waits for its answer, so its last state stays current
however late it came (a starved simulator sends its parts seconds apart).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, cast

import numpy as np

from fed_ros.core.data.episode import OBJECT_STATE_DIM


class ArmStateStore:
    """Newest value of each arm-state part: (receive time, value, arm stamp in ns)."""

    def __init__(
        self, state_timeout_s: float, lockstep: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not state_timeout_s > 0:
            raise ValueError(f"state_timeout_s must be > 0, got {state_timeout_s!r}")
        self.state_timeout_s = state_timeout_s
        self.lockstep = lockstep
        self._clock = clock
        self._parts: dict[str, tuple[float, object, int]] = {}

    def put(self, part: str, value: object, stamp_ns: int = 0) -> None:
        """A new sample of ``part`` (``stamp_ns``: the arm's stamp; 0 when it gives none)."""
        self._parts[part] = (self._clock(), value, stamp_ns)

    def stamp(self, part: str, default: int = 0) -> int:
        """The arm stamp of the newest sample of ``part`` (``default`` when none came)."""
        item = self._parts.get(part)
        return default if item is None else item[2]

    def fresh(self, part: str, now: float) -> object | None:
        """The newest value of ``part`` if it came within the state timeout, else None."""
        item = self._parts.get(part)
        return item[1] if item is not None and now - item[0] <= self.state_timeout_s else None

    def current(self, part: str, now: float) -> object | None:
        """The value a tick acts on: the fresh one; for a lockstep arm the newest, however old."""
        if self.lockstep:
            item = self._parts.get(part)
            return None if item is None else item[1]
        return self.fresh(part, now)


# What the joint-state and pose callbacks put: (positions, velocities) for the joints and the
# fingers, (position, quaternion) for the pose.
ArrayPair = tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]


def _pair(store: ArmStateStore, part: str, now: float) -> ArrayPair | None:
    return cast("ArrayPair | None", store.current(part, now))


def observation_from_state(
    store: ArmStateStore,
    now: float,
    has_object_state: bool,
    camera_keys: Mapping[str, str],
    cameras: Iterable[str],
) -> dict[str, Any] | None:
    """The policy's observation from the arm's current state (None when a needed part is stale).

    Joint and gripper positions, end-effector pose, object state (zeros on an arm without
    perception: its policies train without object state) and each camera frame that is there
    (``camera_keys``: camera -> observation key). Velocities ride along as ``_joint_vel`` /
    ``_gripper_vel`` for the JointState messages.
    """
    joints, fingers, pose = (_pair(store, k, now) for k in ("joints", "fingers", "pose"))
    if joints is None or fingers is None or pose is None:
        return None
    obs: dict[str, Any] = {
        "joint_pos": joints[0],
        "gripper_qpos": fingers[0],
        "eef_pos": pose[0],
        "eef_quat": pose[1],
        "_joint_vel": joints[1],
        "_gripper_vel": fingers[1],
    }
    if has_object_state:
        obs["object_state"] = store.current("object_state", now)
        if obs["object_state"] is None:
            return None
    else:
        obs["object_state"] = np.zeros(OBJECT_STATE_DIM, np.float32)
    for cam in cameras:
        image = store.current(cam, now)
        if image is not None:
            obs[camera_keys[cam]] = image
    return obs

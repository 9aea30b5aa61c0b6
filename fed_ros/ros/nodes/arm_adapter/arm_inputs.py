"""The arm adapter's arm side in: standard messages decoded into its arm state, and when they tick.

Joint states are split into the profile's arm joints and gripper fingers (profile order, by
name), the end-effector pose must be in the profile's base frame, a simulator's object state
carries its stamp in the layout label, and cameras are decoded and resized; each goes into the
adapter's :class:`~fed_ros.core.arm.state.ArmStateStore` with the arm's stamp. What makes a
tick depends on the arm: a free-running arm's pose (published after the joint states of the
same controller cycle) starts one; a lockstep arm's state does once every part of one arm cycle
is in (same stamp). The subscriptions themselves are :func:`arm_readiness.subscribe_arm_side`'s.
A bad message is logged (throttled) and dropped; it never reaches the control loop.
"""

from __future__ import annotations

import threading
from typing import Callable, Mapping

import numpy as np

from fed_ros.core.arm.profile import ArmProfile
from fed_ros.core.arm.safety import JointSelector
from fed_ros.core.arm.state import ArmStateStore
from fed_ros.ros.arm import topics as at
from fed_ros.ros.nodes.arm_adapter.arm_readiness import subscribe_arm_side
from fed_ros.ros.wire.images import decode_camera


class ArmInputs:
    """The adapter's arm-side subscriptions and their decoding into ``state``.

    ``on_state(pose_stamp_ns)`` is called when an arm state makes a tick: for a lockstep arm
    (under ``lock``) after every part once all parts of one cycle are in, for a free-running arm
    after every pose. ``on_success(bool)`` gets the task success signal under ``lock``.
    ``clock`` is the monotonic clock (the node's, so tests can drive it).
    """

    def __init__(
        self,
        create_subscription: Callable,
        profile: ArmProfile,
        cameras: Mapping,
        image_size: int,
        state: ArmStateStore,
        lock: threading.RLock,
        logger,
        clock: Callable[[], float],
        on_state: Callable[[int], None],
        on_success: Callable[[bool], None],
        callback_group=None,
    ) -> None:
        self.profile, self.cameras, self.image_size = profile, cameras, image_size
        self._state, self._lock, self._logger, self._clock = state, lock, logger, clock
        self._on_state, self._on_success = on_state, on_success
        self._joints = JointSelector(profile.joints.names)
        self._fingers = JointSelector(profile.gripper.joint_names)
        self.joint_msgs = 0  # joint-state messages so far (homing waits for new ones)
        # key -> (subscription, type name, what publishes it), for the missing-topics report
        self.subscriptions = subscribe_arm_side(
            create_subscription,
            profile,
            cameras,
            {
                "joint_states": self.on_joint_states,
                "eef_pose": self.on_pose,
                "object_state": self.on_object_state,
                "task_success": self.on_success,
                "camera": self.on_camera,
            },
            callback_group=callback_group,
        )

    def joints_now(self) -> tuple[np.ndarray | None, int]:
        """The fresh joint positions (None when stale) and the joint-state messages so far."""
        with self._lock:
            joints = self._state.fresh("joints", self._clock())
            return (None if joints is None else joints[0]), self.joint_msgs

    def _put(self, part: str, value: object, stamp_ns: int = 0) -> None:
        with self._lock:
            self._state.put(part, value, stamp_ns)
        if self._state.lockstep:
            self._lockstep_tick()

    def on_joint_states(self, msg) -> None:
        try:
            pos, vel = self._joints.select(msg.name, msg.position, msg.velocity)
            fingers = self._fingers.select(msg.name, msg.position, msg.velocity)
        except ValueError as exc:
            self._logger.warning(
                f"{self.subscriptions['joint_states'][0].topic_name}: {exc}",
                throttle_duration_sec=5.0,
            )
            return
        with self._lock:
            self._put("fingers", fingers)
            self._put("joints", (pos, vel), at.stamp_to_ns(msg.header.stamp))
            self.joint_msgs += 1

    def on_pose(self, msg) -> None:
        if msg.header.frame_id and msg.header.frame_id != self.profile.frames.base:
            self._logger.warning(
                f"end-effector pose in frame {msg.header.frame_id!r}, expected "
                f"{self.profile.frames.base!r}; ignored",
                throttle_duration_sec=5.0,
            )
            return
        stamp_ns = at.stamp_to_ns(msg.header.stamp)
        self._put("pose", at.decode_pose(msg), stamp_ns)
        if not self._state.lockstep:
            self._on_state(stamp_ns)

    def on_object_state(self, msg) -> None:
        try:
            try:  # a simulator labels its stamp (a perception node publishes none: 0)
                stamp_ns = at.object_state_stamp_ns(msg)
            except ValueError:
                stamp_ns = 0
            self._put("object_state", at.decode_object_state(msg), stamp_ns)
        except ValueError as exc:
            self._logger.warning(f"object state: {exc}", throttle_duration_sec=5.0)

    def on_success(self, msg) -> None:
        with self._lock:
            self._on_success(bool(msg.data))

    def on_camera(self, cam: str, compressed: bool, msg) -> None:
        try:
            self._put(
                cam,
                decode_camera(msg, compressed, self.image_size),
                at.stamp_to_ns(msg.header.stamp),
            )
        except ValueError as exc:
            self._logger.warning(f"camera {cam}: {exc}", throttle_duration_sec=5.0)

    def _lockstep_tick(self) -> None:
        """Lockstep: one tick per new arm state, once every part of it is in (same stamp)."""
        with self._lock:
            stamp = self._state.stamp("pose")
            parts = ["joints", *self.cameras] + (
                ["object_state"] if self.profile.topics.object_state else []
            )
            if stamp == 0 or any(self._state.stamp(k, -1) not in (stamp, 0) for k in parts):
                return  # the rest of this arm cycle is still on its way
            self._on_state(stamp)

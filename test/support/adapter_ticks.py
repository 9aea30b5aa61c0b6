"""An in-process arm adapter and the arm states that make its ticks: shared by the tick and hand-
back tests."""

from __future__ import annotations

import pytest
from fed_ros.core.data.episode import OBJECT_STATE_DIM  # noqa: E402


rclpy = pytest.importorskip("rclpy")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t


def _arm_state(node, clock, stamp_ns: int, pose_delay_s: float = 0.0) -> None:
    """One simulator cycle: joint_states, object_state, then (after a delay) the pose."""
    from builtin_interfaces.msg import Time
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float32MultiArray, MultiArrayDimension
    from fed_ros.ros.arm import topics as at

    prof = node.profile
    stamp = Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000)
    js = JointState()
    js.header.stamp = stamp
    js.name = list(prof.joints.names) + list(prof.gripper.joint_names)
    js.position = [0.1] * len(js.name)
    js.velocity = [0.0] * len(js.name)
    node.inputs.on_joint_states(js)
    obj = Float32MultiArray(data=[0.0] * OBJECT_STATE_DIM)
    obj.layout.dim = [
        MultiArrayDimension(label=at.object_state_label(stamp_ns), size=OBJECT_STATE_DIM)
    ]
    node.inputs.on_object_state(obj)
    clock.t += pose_delay_s
    pose = PoseStamped()
    pose.header.stamp = stamp
    pose.header.frame_id = prof.frames.base
    pose.pose.position.x, pose.pose.orientation.w = 0.4, 1.0
    node.inputs.on_pose(pose)


def _start_episode(node, clock) -> None:
    # What the reset service leaves behind (arm_adapter.reset.EpisodeReset), without the home
    # motion.
    _arm_state(node, clock, 1_000_000_000)
    episode = node.episode
    episode.number, episode.step, episode.done, episode.success = 1, 0, False, False
    node.safety.hold(False)
    assert node.control.publish_observation(clock.t)

"""An arm adapter against a recording arm (no simulator): what it sends on each stop path, shared
by the stop-path, teleop and robot tests."""

from __future__ import annotations

import threading
from pathlib import Path
import numpy as np
import pytest
import yaml


ADAPTER = "fed_ros.ros.nodes.arm_adapter.arm_adapter_node"


NS = "/robot_0"


CLOSED = 0.79  # ur5e profile: gripper closed position, rad


NO_WATCHDOG = "{watchdog_timeout_s: 30.0}"  # so the watchdog cannot mask the zero under test


class RecordingArm:
    """A ur5e on standard interfaces: joint states and tool pose at 20 Hz, homes on a trajectory,
    and records every command (twist, joint velocities, gripper) in arrival order."""

    def __init__(self, node, profile) -> None:
        from geometry_msgs.msg import PoseStamped, TwistStamped
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory
        from fed_ros.ros.wire import qos

        self.node, self.profile = node, profile
        self.q = np.zeros(len(profile.joints.names))
        self.lock = threading.Lock()
        self.commands: list[tuple[str, object]] = []  # ("twist" | "joint" | "gripper", msg)
        self._js = node.create_publisher(JointState, "/joint_states", qos.command_qos(depth=10))
        self._pose = node.create_publisher(PoseStamped, "/tool0_pose", qos.sensor_qos())
        self._JointState, self._PoseStamped = JointState, PoseStamped
        t = profile.topics
        for kind, msg_type, topic in (
            ("twist", TwistStamped, t.twist_command),
            ("joint", Float64MultiArray, t.joint_command),
            ("gripper", Float64MultiArray, t.gripper_command),
        ):
            node.create_subscription(
                msg_type, topic, lambda m, k=kind: self._record(k, m), qos.command_qos(depth=100)
            )
        node.create_subscription(
            JointTrajectory, t.home_trajectory, self._home, qos.command_qos(depth=10)
        )
        node.create_timer(0.05, self._publish)

    def _record(self, kind: str, msg) -> None:
        with self.lock:
            self.commands.append((kind, msg))

    def _home(self, msg) -> None:
        self.q = np.array(msg.points[-1].positions)

    def _publish(self) -> None:
        js = self._JointState(
            name=["robotiq_85_left_knuckle_joint", *self.profile.joints.names],
            position=[0.1, *self.q.tolist()],
        )
        js.header.stamp = self.node.get_clock().now().to_msg()
        self._js.publish(js)
        pose = self._PoseStamped()
        pose.header.frame_id, pose.header.stamp = "base", js.header.stamp
        pose.pose.position.x, pose.pose.position.z, pose.pose.orientation.w = -0.45, 0.3, 1.0
        self._pose.publish(pose)

    def count(self) -> int:
        with self.lock:
            return len(self.commands)

    def last(self, kind: str, since: int = 0):
        with self.lock:
            found = [m for k, m in self.commands[since:] if k == kind]
        return found[-1] if found else None

    def moving(self, since: int = 0) -> bool:
        """A non-zero twist arrived (after the first ``since`` commands)."""
        with self.lock:
            return any(k == "twist" and _speed(m) > 0 for k, m in self.commands[since:])

    def assert_stopped(
        self,
        since: int,
        gripper_at: float | None = CLOSED,
        zero_since: int | None = None,
        stopped_by: int | None = None,
    ) -> None:
        """The last command of every kind is the zero, and nothing moved after the stop
        (``gripper_at``: where the gripper must be held; None: any position, but one was sent).
        ``zero_since``: where the joint and gripper zero may be found (default ``since``).

        Without ``stopped_by`` the driver never sends a zero twist of its own, so the first zero
        twist after ``since`` is the stop and nothing may move after it. A scripted expert does
        send zero twists mid-episode (it holds still while its gripper closes), so with
        ``stopped_by`` (the command count once the stop was acknowledged) the rule is: the last
        movement came before ``stopped_by`` and a zero twist followed it."""
        with self.lock:
            after = self.commands[since:]
        twists = [(i, m) for i, (k, m) in enumerate(after, start=since) if k == "twist"]
        if stopped_by is None:
            first_zero = next((j for j, (_, m) in enumerate(twists) if _speed(m) == 0.0), None)
            assert first_zero is not None, (
                f"no zero twist after the stop ({len(twists)} twists, last "
                f"{_speed(twists[-1][1]) if twists else None} m/s)"
            )
            assert all(_speed(m) == 0.0 for _, m in twists[first_zero:]), (
                "the arm moved again after its zero"
            )
        else:
            moves = [i for i, m in twists if _speed(m) > 0.0]
            assert not moves or moves[-1] < stopped_by, (
                f"the arm moved after the stop (command {moves[-1]}, "
                f"stop acknowledged at {stopped_by})"
            )
            assert (
                twists and _speed(twists[-1][1]) == 0.0 and (not moves or twists[-1][0] > moves[-1])
            ), f"no zero twist after the last movement ({len(twists)} twists)"
        zero_since = since if zero_since is None else zero_since
        joint, gripper = self.last("joint", zero_since), self.last("gripper", zero_since)
        assert joint is not None and list(joint.data) == [0.0] * len(self.profile.joints.names), (
            joint
        )
        assert gripper is not None, "no gripper hold after the stop"
        if gripper_at is not None:
            assert gripper.data[0] == pytest.approx(gripper_at), gripper


def _speed(twist) -> float:
    t = twist.twist
    return float(
        np.abs([t.linear.x, t.linear.y, t.linear.z, t.angular.x, t.angular.y, t.angular.z]).max()
    )


def _adapter_params(tmp_path: Path, watchdog: str = NO_WATCHDOG, **extra) -> Path:
    path = tmp_path / "adapter.yaml"
    params = {
        "profile": "ur5e",
        "cameras": False,
        "profile_overrides": watchdog,
        "max_episode_steps": 100000,
        **extra,
    }
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    return path


def start_adapter(processes, env, tmp_path: Path, watchdog: str = NO_WATCHDOG):
    return processes.python(
        [
            "-m",
            ADAPTER,
            "--ros-args",
            "-r",
            f"__ns:={NS}",
            "--params-file",
            str(_adapter_params(tmp_path, watchdog)),
        ],
        env,
        log_path=tmp_path / "adapter.log",
    )

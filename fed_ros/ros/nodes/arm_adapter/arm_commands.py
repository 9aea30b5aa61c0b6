"""What the arm adapter sends to the arm: its command topics, in standard messages.

    end-effector deltas (OSC_POSITION/POSE) -> geometry_msgs/TwistStamped  (MoveIt Servo)
    joint velocities (JOINT_VELOCITY)       -> std_msgs/Float64MultiArray  (/<controller>/commands)
    gripper                                 -> std_msgs/Float64MultiArray  [position]
    reset                                   -> trajectory_msgs/JointTrajectory to the home pose

Commands are reliable, depth 1, newest wins (MoveIt Servo and ros2_control subscribe
reliable). The adapter's control loop (:mod:`fed_ros.ros.nodes.arm_adapter.control`) decides *what*
to send each tick through the safety filter; this object only turns a :class:`TickOutput` or a
stop into messages, so every stop path sends the same zero.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fed_ros.core.arm.profile import ArmProfile
from fed_ros.core.arm.safety import TickOutput, gripper_position
from fed_ros.ros.arm import topics as at
from fed_ros.ros.wire import qos


class ArmCommandOutput:
    """The arm's command publishers (twist, joint, gripper, home trajectory) and how they are
    filled.

    ``create_publisher`` is the owning node's; ``now_msg`` returns the current time as a
    ``builtin_interfaces/Time`` (the node's clock).
    """

    def __init__(self, profile: ArmProfile, create_publisher: Callable, now_msg: Callable) -> None:
        from geometry_msgs.msg import TwistStamped
        from std_msgs.msg import Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

        self.profile = profile
        self._now_msg = now_msg
        self._TwistStamped, self._Float64MultiArray = TwistStamped, Float64MultiArray
        self._JointTrajectory, self._JointTrajectoryPoint = JointTrajectory, JointTrajectoryPoint
        t = profile.topics
        command = qos.command_qos(depth=1)
        self.twist = create_publisher(TwistStamped, t.twist_command, command)
        self.joint = (
            create_publisher(Float64MultiArray, t.joint_command, command)
            if t.joint_command
            else None
        )
        self.gripper = (
            create_publisher(Float64MultiArray, t.gripper_command, command)
            if t.gripper_command
            else None
        )
        self.home = (
            create_publisher(JointTrajectory, t.home_trajectory, qos.command_qos(depth=1))
            if t.home_trajectory
            else None
        )

    def expected_subscribers(self) -> dict[str, tuple]:
        """Command topic -> (publisher, what should subscribe to it), for the missing-topics
        report."""
        out = {"twist_command": (self.twist, "MoveIt Servo")}
        if self.gripper is not None:
            out["gripper_command"] = (self.gripper, "gripper forward command controller")
        if self.home is not None:
            out["home_trajectory"] = (self.home, "joint trajectory controller")
        return out

    def publishers(self) -> list:
        """The motion command publishers (what a stop must reach)."""
        return [p for p in (self.gripper, self.joint, self.twist) if p is not None]

    def _twist_msg(self, stamp_ns: int):
        twist = self._TwistStamped()
        twist.header.stamp = at.ns_to_stamp(stamp_ns) if stamp_ns else self._now_msg()
        twist.header.frame_id = self.profile.frames.base
        return twist

    def send(
        self,
        out: TickOutput,
        stamp_ns: int,
        gripper: float | None,
        joint_positions: np.ndarray | None,
    ) -> None:
        """Publish one tick's commands (a zero twist when holding).

        The twist carries the stamp of the arm state (pose) it was computed from (now when 0),
        so Servo's staleness check sees the command's real age and a lockstep simulator steps on
        the answer to its latest state. ``gripper`` (normalised; None: not sent) goes first.
        ``joint_positions``: the arm's current ones, for a joint command on a position interface.
        """
        if gripper is not None and self.gripper is not None:
            self.gripper.publish(
                self._Float64MultiArray(data=[gripper_position(gripper, self.profile.gripper)])
            )
        twist = self._twist_msg(stamp_ns)
        if out.kind == "twist":
            (twist.twist.linear.x, twist.twist.linear.y, twist.twist.linear.z) = (
                float(v) for v in out.linear
            )
            (twist.twist.angular.x, twist.twist.angular.y, twist.twist.angular.z) = (
                float(v) for v in out.angular
            )
        if out.kind == "joint" and self.joint is not None:
            vel = out.joint_velocities
            if self.profile.topics.joint_command_interface == "position":
                vel = (
                    None
                    if joint_positions is None
                    else joint_positions + vel * self.profile.period_s
                )
            if vel is not None:
                self.joint.publish(self._Float64MultiArray(data=[float(v) for v in vel]))
        else:
            # Servo holds on a zero twist; joint modes also get one so Servo never drifts.
            self.twist.publish(twist)

    def send_zero(self, gripper: float, joint_positions: np.ndarray | None) -> None:
        """The stop: the gripper held at ``gripper`` (normalised, the last commanded), zero joint
        velocities (``joint_positions`` on a position interface; nothing when unknown) and a zero
        twist.
        """
        if self.gripper is not None:
            self.gripper.publish(
                self._Float64MultiArray(data=[gripper_position(gripper, self.profile.gripper)])
            )
        if self.joint is not None:
            if self.profile.topics.joint_command_interface == "position":
                hold = None if joint_positions is None else [float(v) for v in joint_positions]
            else:
                hold = [0.0] * len(self.profile.joints.names)
            if hold is not None:  # no known position: nothing safe to command on that interface
                self.joint.publish(self._Float64MultiArray(data=hold))
        self.twist.publish(self._twist_msg(0))

    def send_home(self) -> None:
        """The home trajectory: one point at the profile's home pose, ``home_duration_s`` from
        now."""
        joints = self.profile.joints
        traj = self._JointTrajectory()
        traj.joint_names = list(joints.names)
        point = self._JointTrajectoryPoint()
        point.positions = [float(v) for v in joints.home]
        point.time_from_start.sec = int(joints.home_duration_s)
        point.time_from_start.nanosec = int((joints.home_duration_s % 1.0) * 1e9)
        traj.points = [point]
        self.home.publish(traj)

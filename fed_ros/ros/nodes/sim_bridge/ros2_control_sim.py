"""What a ros2_control + MoveIt Servo arm offers, for the simulated Panda (sim bridge mode).

``sim_bridge_node`` with ``interface:=ros2_control`` uses this instead of the fed_ros arm
topics, so only standard messages cross between the simulated arm and the arm adapter
(names from the arm profile, relative to the bridge's namespace in ``panda_sim``):

    joint_states                           sensor_msgs/JointState, all joints (fingers, an
                                           extra joint, arm joints in reverse order), as
                                           joint_state_broadcaster publishes them
    eef_pose                               geometry_msgs/PoseStamped (a TF relay's output)
    object_state                           std_msgs/Float32MultiArray (perception stand-in)
    task_success                           std_msgs/Bool (success detector stand-in)
    camera/<name>/image_raw[/compressed]   sensor_msgs/Image or CompressedImage
    servo_node/delta_twist_cmds            geometry_msgs/TwistStamped in (MoveIt Servo)
    gripper_controller/commands            std_msgs/Float64MultiArray [position] in
    joint_trajectory_controller/joint_trajectory  trajectory_msgs/JointTrajectory in: the
                                           simulator resets the scene (next seed) and the
                                           arm to its home pose, as an operator would

Lockstep (``on_answer`` given; the bridge's ``lockstep:=true``): the simulator steps once
per answer, i.e. when the twist stamped with its latest state's stamp and a gripper command
sent after that state have both arrived (the adapter sends the gripper first, once per
answer); meanwhile it re-sends that state (same stamp) at the control rate, as a standing
arm keeps reporting. The object state then carries its stamp in the layout label (a
simulator may; perception does not). A real arm never waits: this is for reproducible SIL.

The inverse of the adapter's scaling turns a twist back into robosuite's normalised delta
(``v / max_linear_speed``), so sim demonstrations round-trip exactly.
"""

from __future__ import annotations

import time

import numpy as np

from fed_ros.core.arm.profile import ArmProfile
from fed_ros.core.arm.safety import gripper_action
from fed_ros.core.data.episode import AGENTVIEW_IMAGE, WRIST_IMAGE
from fed_ros.ros.arm import topics as at
from fed_ros.ros.wire import qos
from fed_ros.ros.wire.images import encode_compressed

EXTRA_JOINT = "sim_base_rotation_joint"  # a joint the profile does not list (filtered out)
_CAMERA_KEYS = {"agentview": AGENTVIEW_IMAGE, "wrist": WRIST_IMAGE}


class Ros2ControlSim:
    """Arm-side endpoints of one simulated arm; the bridge calls it each tick."""

    def __init__(
        self, node, profile: ArmProfile, command_timeout_ns: int, on_home, on_answer=None
    ) -> None:
        from geometry_msgs.msg import PoseStamped, TwistStamped
        from sensor_msgs.msg import CompressedImage, Image, JointState
        from std_msgs.msg import Bool, Float32MultiArray, Float64MultiArray
        from trajectory_msgs.msg import JointTrajectory

        self.node, self.profile = node, profile
        self.command_timeout_ns = command_timeout_ns
        self._on_home = on_home
        self._JointState, self._Bool = JointState, Bool
        self._CompressedImage = CompressedImage
        t = profile.topics
        # joint_state_broadcaster and controllers use reliable, depth 10.
        self._pub_joints = node.create_publisher(
            JointState, t.joint_states, qos.command_qos(depth=10)
        )
        self._pub_pose = node.create_publisher(PoseStamped, t.eef_pose, qos.sensor_qos())
        self._pub_objects = (
            node.create_publisher(Float32MultiArray, t.object_state, qos.sensor_qos())
            if t.object_state
            else None
        )
        self._pub_success = (
            node.create_publisher(Bool, t.task_success, qos.command_qos(depth=10))
            if t.task_success
            else None
        )
        self._pub_cameras = {
            cam: (
                node.create_publisher(
                    CompressedImage if cfg.compressed else Image, cfg.topic, qos.sensor_qos()
                ),
                cfg.compressed,
            )
            for cam, cfg in profile.cameras.items()
        }
        self._subs = [
            node.create_subscription(
                TwistStamped, t.twist_command, self._on_twist, qos.command_qos(depth=10)
            ),
            node.create_subscription(
                JointTrajectory, t.home_trajectory, self._on_trajectory, qos.command_qos(depth=10)
            ),
        ]
        if t.gripper_command:
            self._subs.append(
                node.create_subscription(
                    Float64MultiArray,
                    t.gripper_command,
                    self._on_gripper,
                    qos.command_qos(depth=10),
                )
            )
        self._twist: tuple[np.ndarray, int] | None = None
        self._gripper = -1.0  # robosuite resets with the gripper open
        self.ignored_angular = 0
        self._on_answer = (
            on_answer  # lockstep: called with (delta, gripper) once per answered state
        )
        self._state_ns = 0  # stamp of the latest published state
        self._answer: np.ndarray | None = None
        self._gripper_fresh = False  # a gripper command arrived since the latest state
        self._last: list = []  # (publisher, message) of the latest state

    def reset(self) -> None:
        """Forget commands of the previous episode (the gripper opens, as robosuite's reset)."""
        self._twist = None
        self._gripper = -1.0

    # ------------------------------------------------------------------ commands in
    def _on_twist(self, msg) -> None:
        if msg.header.frame_id and msg.header.frame_id != self.profile.frames.base:
            self.node.get_logger().warning(
                f"twist in frame {msg.header.frame_id!r}, expected "
                f"{self.profile.frames.base!r}; ignored",
                throttle_duration_sec=5.0,
            )
            return
        lin, ang = msg.twist.linear, msg.twist.angular
        if any(abs(v) > 1e-9 for v in (ang.x, ang.y, ang.z)):
            self.ignored_angular += 1  # the simulated arm is position-only (OSC_POSITION)
        delta = np.array([lin.x, lin.y, lin.z]) / self.profile.limits.max_linear_speed
        self._twist = (np.clip(delta, -1.0, 1.0).astype(np.float32), time.monotonic_ns())
        if self._on_answer is not None and at.stamp_to_ns(msg.header.stamp) == self._state_ns:
            self._answer = self._twist[0]
            self._maybe_answer()

    def _on_gripper(self, msg) -> None:
        if len(msg.data) != 1 or not np.isfinite(msg.data[0]):
            self.node.get_logger().warning(
                f"gripper command {list(msg.data)} is not one finite position"
            )
            return
        self._gripper = gripper_action(float(msg.data[0]), self.profile.gripper)
        self._gripper_fresh = True
        self._maybe_answer()

    def _maybe_answer(self) -> None:
        if self._on_answer is None or self._answer is None:
            return
        if self.profile.topics.gripper_command and not self._gripper_fresh:
            return  # this answer's gripper command is still on its way
        delta, self._answer, self._gripper_fresh = self._answer, None, False
        self._on_answer(delta, self._gripper)

    def republish(self) -> None:
        """Lockstep: re-send the latest state (same stamp) while no answer came."""
        for pub, msg in self._last:
            pub.publish(msg)

    def _on_trajectory(self, msg) -> None:
        if list(msg.joint_names) != list(self.profile.joints.names) or not msg.points:
            self.node.get_logger().warning(
                f"trajectory for joints {list(msg.joint_names)} ignored "
                f"(expected {list(self.profile.joints.names)})"
            )
            return
        self._on_home()

    def current(self) -> tuple[np.ndarray, float, bool]:
        """(normalised delta, gripper, hold): hold when no twist is younger than the timeout."""
        twist = self._twist
        if twist is None or time.monotonic_ns() - twist[1] > self.command_timeout_ns:
            return np.zeros(3, np.float32), self._gripper, True  # Servo stops without commands
        return twist[0], self._gripper, False

    # ------------------------------------------------------------------ state out
    def publish(
        self,
        obs: dict,
        stamp_ns: int,
        *,
        joint_names,
        gripper_names,
        joint_vel,
        gripper_vel,
        success: bool,
    ) -> None:
        """Publish one tick's state as a ros2_control arm would."""
        stamp = at.ns_to_stamp(stamp_ns)
        self._state_ns, self._answer, self._gripper_fresh = stamp_ns, None, False
        self._last = []
        joints = self._JointState()
        joints.header.stamp = stamp
        arm = list(zip(joint_names, obs["joint_pos"], joint_vel))[::-1]
        fingers = list(zip(gripper_names, obs["gripper_qpos"], gripper_vel))
        rows = fingers + [(EXTRA_JOINT, 0.0, 0.0)] + arm
        joints.name = [str(n) for n, _, _ in rows]
        joints.position = [float(p) for _, p, _ in rows]
        joints.velocity = [float(v) for _, _, v in rows]
        self._send(self._pub_joints, joints)
        messages = at.observation_messages(
            obs, stamp_ns, joint_names=joint_names, gripper_names=gripper_names
        )
        if self._pub_objects is not None:
            objects = messages[at.OBJECT_STATE_TOPIC]
            if self._on_answer is None:
                objects.layout.dim[0].label = "object_state"  # perception publishes no tick stamp
            self._send(self._pub_objects, objects)
        for cam, (pub, compressed) in self._pub_cameras.items():
            image = obs.get(_CAMERA_KEYS[cam])
            if image is None:
                continue
            if compressed:
                msg = self._CompressedImage(format="jpeg")
                msg.header.stamp = stamp
                msg.header.frame_id = f"{cam}_camera"
                msg.data = encode_compressed(image, "jpeg")
                self._send(pub, msg)
            else:
                self._send(pub, at.image_to_msg(image, stamp, f"{cam}_camera"))
        if self._pub_success is not None:
            self._send(self._pub_success, self._Bool(data=bool(success)))
        # The pose last: the adapter starts its tick on it, with this cycle's state all in.
        pose = messages[at.EEF_POSE_TOPIC]
        pose.header.frame_id = self.profile.frames.base
        self._send(self._pub_pose, pose)

    def _send(self, pub, msg) -> None:
        pub.publish(msg)
        self._last.append((pub, msg))

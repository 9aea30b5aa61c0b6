"""The arm adapter's policy side out: observations under one tick stamp, and what goes with them.

Each tick the adapter re-publishes the newest arm state under one new tick stamp (the
synchronisation rule, docs/arms.md) with the EpisodeStatus of that stamp; the command applied
in answer to an observation is published stamped with it; the task's instruction goes out at
start and at every reset. This object owns those publishers and the stamps that tie them
together: the current observation's, the arm state's behind it, and the one whose answer was
applied. A lockstep arm re-sending its unanswered state gets that observation again (a
best-effort sample to the policy may have been lost). The adapter node
(:mod:`fed_ros.ros.nodes.arm_adapter.arm_adapter_node`) calls it under its lock.
"""

from __future__ import annotations

from typing import Callable, Mapping

from fed_ros.core.arm.profile import ArmProfile
from fed_ros.core.arm.safety import TickOutput
from fed_ros.core.arm.state import ArmStateStore, observation_from_state
from fed_ros.core.data.episode import AGENTVIEW_IMAGE, WRIST_IMAGE
from fed_ros.ros.arm import topics as at
from fed_ros.ros.nodes.arm_adapter.episode import AdapterEpisode

_CAMERA_TOPICS = {"agentview": at.AGENTVIEW_TOPIC, "wrist": at.WRIST_TOPIC}
_CAMERA_KEYS = {"agentview": AGENTVIEW_IMAGE, "wrist": WRIST_IMAGE}
# A lockstep arm re-sending its unanswered state gets the observation again at most this often.
RESEND_AFTER_S = 1.0


class ObservationPublisher:
    """The policy-side publishers (observation, task, applied command, episode status).

    ``create_publisher`` is the owning node's; ``now_ns`` its ROS clock in nanoseconds (tick
    stamps); ``clock`` the monotonic clock every other time read goes through.
    """

    def __init__(
        self,
        profile: ArmProfile,
        cameras: Mapping,
        create_publisher: Callable,
        now_ns: Callable[[], int],
        clock: Callable[[], float],
    ) -> None:
        from fed_ros.msg import ArmCommand, EpisodeStatus
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float32MultiArray, String

        self.profile, self.cameras = profile, cameras
        self._now_ns, self._clock = now_ns, clock
        self._ArmCommand, self._EpisodeStatus, self._String = ArmCommand, EpisodeStatus, String

        def pub(msg_type, rel):
            return create_publisher(msg_type, rel, at.qos_for(rel, subscriber=False))

        self._observation_pubs = {
            at.JOINT_STATES_TOPIC: pub(JointState, at.JOINT_STATES_TOPIC),
            at.GRIPPER_STATE_TOPIC: pub(JointState, at.GRIPPER_STATE_TOPIC),
            at.EEF_POSE_TOPIC: pub(PoseStamped, at.EEF_POSE_TOPIC),
            at.OBJECT_STATE_TOPIC: pub(Float32MultiArray, at.OBJECT_STATE_TOPIC),
        }
        for cam in cameras:
            self._observation_pubs[_CAMERA_TOPICS[cam]] = pub(Image, _CAMERA_TOPICS[cam])
        self._task = pub(String, at.TASK_TOPIC)
        self._applied = pub(ArmCommand, at.APPLIED_COMMAND_TOPIC)
        self._status = pub(EpisodeStatus, at.EPISODE_STATUS_TOPIC)
        self.stamp_ns = 0  # the current observation's tick stamp (what a command answers)
        self.arm_stamp_ns = 0  # arm-state (pose) stamp behind the current observation
        self.applied_ns = 0  # observation stamp whose applied command is published
        self._last_stamp_ns = 0
        self._messages: list = []  # (publisher, message) of the current observation (re-send)
        self._published_at = 0.0
        self.human_control = False  # what the current observation's status says

    @property
    def answered(self) -> bool:
        """Whether the current observation's applied command is published."""
        return self.applied_ns == self.stamp_ns

    def publish_task(self, instruction: str) -> None:
        self._task.publish(self._String(data=instruction))

    def publish(
        self, state: ArmStateStore, now: float, episode: AdapterEpisode, overruns: int
    ) -> bool:
        """Re-publish the newest arm state under one new tick stamp; False when it is stale."""
        obs = observation_from_state(
            state, now, bool(self.profile.topics.object_state), _CAMERA_KEYS, self.cameras
        )
        if obs is None:
            return False
        joint_vel, gripper_vel = obs.pop("_joint_vel"), obs.pop("_gripper_vel")
        stamp_ns = max(self._now_ns(), self._last_stamp_ns + 1)
        self._last_stamp_ns = self.stamp_ns = stamp_ns
        self.arm_stamp_ns = state.stamp("pose")
        messages = at.observation_messages(
            obs,
            stamp_ns,
            joint_names=self.profile.joints.names,
            gripper_names=self.profile.gripper.joint_names,
            joint_vel=joint_vel,
            gripper_vel=gripper_vel,
            frame_prefix="",
        )
        messages[at.EEF_POSE_TOPIC].header.frame_id = self.profile.frames.base
        self._messages = [
            (self._observation_pubs[rel], msg)
            for rel, msg in messages.items()
            if rel in self._observation_pubs
        ]
        for pub_, msg in self._messages:
            pub_.publish(msg)
        status = self._EpisodeStatus()
        status.header.stamp = at.ns_to_stamp(stamp_ns)
        status.task, status.instruction, status.variation = (
            episode.task,
            episode.instruction(),
            "",
        )
        status.episode, status.step, status.success = episode.number, episode.step, episode.success
        status.done, status.overruns = episode.done, overruns
        control = episode.control
        status.human_control = self.human_control = control.human_active(now)
        status.interventions = control.interventions
        status.human_seconds = float(control.human_seconds(now))
        self._status.publish(status)
        self._messages.append((self._status, status))
        self._published_at = self._clock()
        return True

    def publish_applied(self, out: TickOutput, source: str) -> None:
        """Publish the command applied in answer to the current observation (stamped with it);
        ``source`` is who produced it (``policy:<sha>``, ``teleop``...), so a recording says
        which steps a human drove."""
        msg = at.applied_command_msg(
            self._ArmCommand(), out, self.stamp_ns, self.profile.frames.base
        )
        if out.kind != "hold":
            msg.source = source
        self._applied.publish(msg)
        self.applied_ns = self.stamp_ns

    def resend_unanswered(self) -> None:
        """A lockstep arm re-sent the unanswered state: re-send its observation (same stamp),
        one best-effort sample to the policy may have been lost."""
        if not self.answered and self._clock() - self._published_at >= RESEND_AFTER_S:
            for pub_, msg in self._messages:
                pub_.publish(msg)
            self._published_at = self._clock()

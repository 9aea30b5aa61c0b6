"""What a sim bridge with the direct interface publishes: the fed_ros arm topics of one tick
(observation, episode status, applied command, task) and their lockstep re-sending.

The node decides when a tick happens; this decides what goes on the wire for it, in which
order, and keeps the tick's messages so that a lockstep bridge can re-send an unanswered tick
with its stamp. It takes the node's ``create_publisher`` (an explicit collaborator, never the
node) and reads the episode from a :class:`~fed_ros.ros.nodes.sim_bridge.sim_episode.SimEpisode`.
The ``ros2_control`` interface publishes standard messages instead
(:mod:`fed_ros.ros.nodes.sim_bridge.ros2_control_sim`).
"""

from __future__ import annotations

import time

import numpy as np

from fed_ros.core.arm.safety import MODE_HOLD, MODE_OSC_POSITION
from fed_ros.ros.arm import topics as at
from fed_ros.ros.nodes.sim_bridge.sim_episode import SimEpisode


class DirectArmOutput:
    """Publishers of the fed_ros arm topics of one simulated arm (relative names)."""

    def __init__(self, create_publisher, cameras: bool, frame_prefix: str) -> None:
        from fed_ros.msg import ArmCommand, EpisodeStatus
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float32MultiArray, String

        def pub(msg_type, rel):
            return create_publisher(msg_type, rel, at.qos_for(rel, subscriber=False))

        self.frame_prefix = frame_prefix
        self._ArmCommand, self._EpisodeStatus, self._String = ArmCommand, EpisodeStatus, String
        # Observation topics, published in this order each tick (images first: largest).
        self._publishers_by_topic = {}
        if cameras:
            self._publishers_by_topic[at.AGENTVIEW_TOPIC] = pub(Image, at.AGENTVIEW_TOPIC)
            self._publishers_by_topic[at.WRIST_TOPIC] = pub(Image, at.WRIST_TOPIC)
        self._publishers_by_topic[at.JOINT_STATES_TOPIC] = pub(JointState, at.JOINT_STATES_TOPIC)
        self._publishers_by_topic[at.GRIPPER_STATE_TOPIC] = pub(JointState, at.GRIPPER_STATE_TOPIC)
        self._publishers_by_topic[at.EEF_POSE_TOPIC] = pub(PoseStamped, at.EEF_POSE_TOPIC)
        self._publishers_by_topic[at.OBJECT_STATE_TOPIC] = pub(
            Float32MultiArray, at.OBJECT_STATE_TOPIC
        )
        self._pub_task = pub(String, at.TASK_TOPIC)
        self._pub_applied = pub(ArmCommand, at.APPLIED_COMMAND_TOPIC)
        self._pub_status = pub(EpisodeStatus, at.EPISODE_STATUS_TOPIC)
        # (publisher, message) of the current tick, and when they were last sent (monotonic s)
        self._last_published: list[tuple[object, object]] = []
        self._published_at = 0.0

    def publish_task(self, instruction: str) -> None:
        """The episode's instruction on ``arm/task`` (latched: late subscribers get it)."""
        self._pub_task.publish(self._String(data=instruction))

    def publish_applied(self, stamp_ns: int, action: np.ndarray, hold: bool, source: str) -> None:
        """``arm/applied_command``: the 4-D ``action`` the arm applies to the observation
        stamped ``stamp_ns`` (published before stepping), and which code commanded it."""
        applied = self._ArmCommand()
        applied.header.stamp = at.ns_to_stamp(stamp_ns)
        applied.header.frame_id = self.frame_prefix + "base"
        applied.action = action[:3].tolist()
        applied.gripper = float(action[3])
        applied.mode = MODE_HOLD if hold else MODE_OSC_POSITION
        applied.source = source
        self._pub_applied.publish(applied)

    def publish_tick(self, sim: SimEpisode, stamp_ns: int, overruns: int) -> None:
        """The observation of ``sim`` and its episode status, all stamped ``stamp_ns``."""
        joint_vel, gripper_vel = sim.velocities()
        messages = at.observation_messages(
            sim.obs,
            stamp_ns,
            joint_names=sim.env.joint_names,
            gripper_names=sim.env.gripper_joint_names,
            joint_vel=joint_vel,
            gripper_vel=gripper_vel,
            frame_prefix=self.frame_prefix,
        )
        published = [
            (self._publishers_by_topic[rel], msg)
            for rel, msg in messages.items()
            if rel in self._publishers_by_topic
        ]
        for publisher, msg in published:
            publisher.publish(msg)
        status = self._EpisodeStatus()
        status.header.stamp = at.ns_to_stamp(stamp_ns)
        status.task, status.instruction, status.variation = (
            sim.task,
            sim.env.instruction,
            sim.variation,
        )
        status.episode, status.step = sim.episode, sim.step_index
        status.success, status.done, status.overruns = sim.success, sim.done, overruns
        self._pub_status.publish(status)
        self._last_published = published + [(self._pub_status, status)]
        self._published_at = time.monotonic()

    def republish_if_unanswered(self, republish_s: float) -> None:
        """Lockstep: re-send the current tick's messages (same stamp) every ``republish_s``
        while nothing answers it. Observation topics are best effort: one lost sample under
        load left the client without a complete observation and the episode stalled until its
        timeout (then counted as a failure). Clients and recordings ignore duplicates of a
        stamp; an idle bridge re-sends one small tick per period (two 84x84 images with
        cameras)."""
        if not self._last_published or time.monotonic() - self._published_at < republish_s:
            return
        for publisher, msg in self._last_published:
            publisher.publish(msg)
        self._published_at = time.monotonic()

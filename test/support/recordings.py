"""Synthetic arm ticks, their messages and rosbag2 recordings of them, and a tiny arm that
publishes them: shared by the recorder, camera, intervention and quarantine tests."""

from __future__ import annotations

import time
from pathlib import Path
import numpy as np
from fed_ros.core.data.episode import (
    AGENTVIEW_IMAGE,
    EEF_POS,
    EEF_QUAT,
    GRIPPER_QPOS,
    JOINT_POS,
    OBJECT_STATE,
    OBJECT_STATE_DIM,
    WRIST_IMAGE,
)
from fed_ros.ros.arm import topics as at
from fed_ros.ros.arm.recording_topics import RECORDED_TOPICS
from fed_ros.ros.arm.rosbag2_mcap import Rosbag2McapWriter


JOINTS = [f"robot0_joint{i}" for i in range(1, 8)]


FINGERS = ["gripper0_finger_joint1", "gripper0_finger_joint2"]


T0 = 1_700_000_000_000_000_000


def synthetic_ticks(n: int, seed: int = 0, size: int = 16):
    """n ticks of (stamp, observation, applied action) with random content."""
    rng = np.random.default_rng(seed)
    ticks = []
    for k in range(n):
        obs = {
            AGENTVIEW_IMAGE: rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            WRIST_IMAGE: rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
            JOINT_POS: rng.normal(size=7).astype(np.float32),
            GRIPPER_QPOS: rng.normal(size=2).astype(np.float32),
            EEF_POS: rng.normal(size=3).astype(np.float32),
            EEF_QUAT: rng.normal(size=4).astype(np.float32),
            OBJECT_STATE: rng.normal(size=OBJECT_STATE_DIM).astype(np.float32),
        }
        action = rng.uniform(-1, 1, 4).astype(np.float32)
        ticks.append((T0 + k * 50_000_000, obs, action))
    return ticks


def tick_messages(stamp_ns, obs, action, episode=1, step=0, done=False, omit=()):
    """Messages of one tick keyed by relative topic, in the bridge's publishing order."""
    from fed_ros.msg import ArmCommand, EpisodeStatus

    applied = ArmCommand()
    applied.header.stamp = at.ns_to_stamp(stamp_ns)
    applied.action = action[:3].tolist()
    applied.gripper = float(action[3])
    applied.source = "test"
    msgs = {at.APPLIED_COMMAND_TOPIC: applied}
    msgs.update(at.observation_messages(obs, stamp_ns, joint_names=JOINTS, gripper_names=FINGERS))
    status = EpisodeStatus()
    status.header.stamp = at.ns_to_stamp(stamp_ns)
    status.task, status.episode, status.step, status.done = "lift", episode, step, done
    msgs[at.EPISODE_STATUS_TOPIC] = status
    return {rel: m for rel, m in msgs.items() if rel not in omit}


def write_bag(directory: Path, ticks, *, success=True, omit=(), cameras=True) -> Path:
    """A bag as the Recorder writes it, built directly with the writer."""
    from rclpy.serialization import serialize_message

    writer = Rosbag2McapWriter(directory)
    for rel, msgtype in RECORDED_TOPICS.items():
        if rel not in omit and (cameras or rel not in (at.AGENTVIEW_TOPIC, at.WRIST_TOPIC)):
            writer.add_topic("/robot_1/" + rel, msgtype, at.qos_for(rel))
    for k, (stamp, obs, action) in enumerate(ticks):
        for rel, msg in tick_messages(stamp, obs, action, step=k, omit=omit).items():
            if cameras or rel not in (at.AGENTVIEW_TOPIC, at.WRIST_TOPIC):
                writer.write("/robot_1/" + rel, serialize_message(msg), stamp + 1000)
    writer.close(
        {
            "robot_id": "robot_1",
            "task": "lift",
            "instruction": "lift the red cube",
            "variation": "default",
            "success": "true" if success else "false",
            "cameras": "true" if cameras else "false",
            "arm_namespace": "/robot_1",
        }
    )
    return directory


class TinyArm:
    """A minimal arm driver publishing synthetic ticks on the arm topics (no simulator)."""

    def __init__(self, node, omit=()):
        from fed_ros.msg import ArmCommand, EpisodeStatus
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float32MultiArray, String

        types = {
            at.AGENTVIEW_TOPIC: Image,
            at.WRIST_TOPIC: Image,
            at.JOINT_STATES_TOPIC: JointState,
            at.GRIPPER_STATE_TOPIC: JointState,
            at.EEF_POSE_TOPIC: PoseStamped,
            at.OBJECT_STATE_TOPIC: Float32MultiArray,
            at.APPLIED_COMMAND_TOPIC: ArmCommand,
            at.EPISODE_STATUS_TOPIC: EpisodeStatus,
            at.TASK_TOPIC: String,
        }
        self.omit = omit
        self.pubs = {
            rel: node.create_publisher(t, rel, at.qos_for(rel, subscriber=False))
            for rel, t in types.items()
            if rel not in omit
        }
        self.pubs[at.TASK_TOPIC].publish(String(data="lift the red cube"))

    def wait_for_subscribers(self, reader_node=None, timeout=10.0):
        """Until every publisher has a subscriber and, with ``reader_node``, that node sees
        every publisher too: matching is asymmetric, the writers can list the recorder's
        readers before those readers know the writers, and a best-effort sample sent then is
        lost (it happened: no joint_states at all in 2 of 5 runs)."""
        deadline = time.monotonic() + timeout
        while any(p.get_subscription_count() == 0 for p in self.pubs.values()) or (
            reader_node is not None
            and any(reader_node.count_publishers(p.topic_name) == 0 for p in self.pubs.values())
        ):
            assert time.monotonic() < deadline, "recorder subscriptions never matched"
            time.sleep(0.05)

    def publish(self, ticks):
        for k, (stamp, obs, action) in enumerate(ticks):
            for rel, msg in tick_messages(stamp, obs, action, step=k, omit=self.omit).items():
                self.pubs[rel].publish(msg)
            time.sleep(0.01)

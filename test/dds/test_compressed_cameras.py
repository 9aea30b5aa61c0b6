"""Compressed cameras on the robot side (issue 18 item 5), over real DDS.

An arm publishes JPEG sensor_msgs/CompressedImage frames on ``.../image_raw/compressed``
(image_transport's names) plus joint states etc. and no object state beyond the zeros an
arm adapter sends for a profile without perception. The Recorder stores the compressed
bytes as they arrived, the episode holds the frames decoded and resized to the policy's
input, an ArmClient assembles the same resized frames, and an image policy without
object_state (``use_object_state=False``) trains on the recorded episodes.
"""

from __future__ import annotations

import time

import numpy as np

from fed_ros.core.data.episode import AGENTVIEW_IMAGE, OBJECT_STATE, OBJECT_STATE_DIM, WRIST_IMAGE
from fed_ros.ros.arm import topics as at
from fed_ros.ros.arm.recorded_episodes import load_recorded_episodes
from fed_ros.ros.arm.recorder import Recorder

from conftest import wait_until
from support.recordings import synthetic_ticks, tick_messages

SIZE = 32  # the policy's image_size; the camera sends 48x64 frames
CAMERAS = {AGENTVIEW_IMAGE: at.AGENTVIEW_TOPIC, WRIST_IMAGE: at.WRIST_TOPIC}


def camera_frame(k: int, seed: int) -> np.ndarray:
    """A smooth 48x64 RGB frame (JPEG keeps it recognisable) with a moving bright square."""
    yy, xx = np.mgrid[0:48, 0:64]
    img = np.stack([xx * 4, yy * 5, np.full_like(xx, 40 * seed)], -1).astype(np.uint8)
    img[10:22, 4 + 3 * k : 16 + 3 * k] = 255
    return img


class CompressedArm:
    """An arm whose cameras travel compressed (as a camera driver's image_transport sends)."""

    def __init__(self, node):
        from fed_ros.msg import ArmCommand, EpisodeStatus
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import CompressedImage, JointState
        from std_msgs.msg import Float32MultiArray, String

        self.CompressedImage = CompressedImage
        types = {
            at.JOINT_STATES_TOPIC: JointState,
            at.GRIPPER_STATE_TOPIC: JointState,
            at.EEF_POSE_TOPIC: PoseStamped,
            at.OBJECT_STATE_TOPIC: Float32MultiArray,
            at.APPLIED_COMMAND_TOPIC: ArmCommand,
            at.EPISODE_STATUS_TOPIC: EpisodeStatus,
            at.TASK_TOPIC: String,
        }
        types.update(
            {at.camera_topic(rel, "compressed"): CompressedImage for rel in CAMERAS.values()}
        )
        self.pubs = {
            rel: node.create_publisher(t, rel, at.qos_for(rel, subscriber=False))
            for rel, t in types.items()
        }
        self.pubs[at.TASK_TOPIC].publish(String(data="lift the red cube"))
        self.sent: dict[str, list] = {key: [] for key in CAMERAS}

    def wait_for_subscribers(self, reader_node, timeout: float = 10.0) -> None:
        """Recorder and ArmClient both subscribe to the observation topics; only the recorder
        to the applied commands. ``reader_node`` (theirs) must see every publisher too:
        matching is asymmetric, and a best-effort sample sent before the reader knows the
        writer is lost."""

        def matched() -> bool:
            return all(
                p.get_subscription_count() >= (1 if rel == at.APPLIED_COMMAND_TOPIC else 2)
                and reader_node.count_publishers(p.topic_name) >= 1
                for rel, p in self.pubs.items()
                if rel != at.TASK_TOPIC
            )

        wait_until(matched, timeout, "robot-side subscriptions on every arm topic")

    def compressed(self, image: np.ndarray, stamp_ns: int):
        from fed_ros.ros.wire.images import encode_compressed

        msg = self.CompressedImage(format="jpeg")
        msg.header.stamp = at.ns_to_stamp(stamp_ns)
        msg.data = encode_compressed(image, "jpeg")
        return msg

    def publish(self, ticks) -> None:
        for k, (stamp, obs, action) in enumerate(ticks):
            msgs = tick_messages(stamp, obs, action, step=k, omit=tuple(CAMERAS.values()))
            for key, rel in CAMERAS.items():
                msg = self.compressed(obs[key], stamp)
                self.sent[key].append(msg)
                msgs[at.camera_topic(rel, "compressed")] = msg
            for rel, msg in msgs.items():
                self.pubs[rel].publish(msg)
            time.sleep(0.01)  # pacing like a control loop, not a wait for another process


def real_arm_ticks(n: int):
    ticks = synthetic_ticks(n, seed=4)
    for k, (_, obs, _) in enumerate(ticks):
        obs[AGENTVIEW_IMAGE], obs[WRIST_IMAGE] = camera_frame(k, 1), camera_frame(k, 2)
        obs[OBJECT_STATE] = np.zeros(OBJECT_STATE_DIM, np.float32)  # no perception
    return ticks


def test_compressed_cameras_recorded_and_trained_on(ros_context, tmp_path):  # noqa: F811 - the fixture
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.configuration_trainer import TrainerConfig
    from fed_ros.learning.trainer import initial_state_dict, train_local
    from fed_ros.ros.arm.arm_client import ArmClient
    from fed_ros.ros.wire.images import decode_camera

    robot = ros_context("robot")
    recorder = Recorder(
        robot, tmp_path, robot_id="robot_ur5e", camera_transport="compressed", image_size=SIZE
    )
    client = ArmClient(robot, camera_transport="compressed", image_size=SIZE)
    arm = CompressedArm(ros_context("ur5e_arm"))
    arm.wait_for_subscribers(robot)
    wait_until(
        lambda: at.TASK_TOPIC in recorder._latest, 10, "the latched instruction at the recorder"
    )
    ticks = real_arm_ticks(10)
    path = recorder.start("lift", "lift the red cube", "default")
    arm.publish(ticks)
    result = recorder.stop(success=True, expected_steps=len(ticks))
    assert result.success and result.num_steps == len(ticks)

    # The episode: frames decoded and resized to the policy's input.
    for key in CAMERAS:
        frames = result.episode.observations[key]
        assert frames.shape == (len(ticks), SIZE, SIZE, 3) and frames.dtype == np.uint8
        expected = np.stack([decode_camera(m, True, SIZE) for m in arm.sent[key]])
        np.testing.assert_array_equal(frames, expected)
    # The bag: the compressed bytes as they arrived, under image_transport's topic names.
    from rosbags.highlevel import AnyReader

    with AnyReader([path]) as reader:
        conns = [c for c in reader.connections if c.topic == "/arm/wrist/image_raw/compressed"]
        assert conns and conns[0].msgtype == "sensor_msgs/msg/CompressedImage"
        assert not [c for c in reader.connections if c.topic.endswith("image_raw")]
        stored = {
            reader.deserialize(raw, c.msgtype).header.stamp.nanosec: reader.deserialize(
                raw, c.msgtype
            )
            for c, _, raw in reader.messages(conns)
        }
    for msg in arm.sent[WRIST_IMAGE]:
        back = stored[msg.header.stamp.nanosec]
        assert back.format == "jpeg" and bytes(back.data) == bytes(msg.data)

    # The robot's ArmClient assembles observations from the same compressed streams.
    obs = None
    while obs is None or obs[0] != ticks[-1][0]:
        obs = client._observations.get(timeout=10.0)
    assert obs[1][AGENTVIEW_IMAGE].shape == (SIZE, SIZE, 3)
    np.testing.assert_array_equal(
        obs[1][WRIST_IMAGE], decode_camera(arm.sent[WRIST_IMAGE][-1], True, SIZE)
    )

    # An image policy without object_state trains on the recorded episodes.
    episodes = load_recorded_episodes(tmp_path)
    assert len(episodes) == 1
    cfg = PolicyConfig(
        kind="image",
        use_object_state=False,
        image_size=SIZE,
        window=2,
        embed_dim=32,
        text_dim=32,
        transformer_ff=64,
        num_keypoints=8,
    )
    trained = train_local(
        initial_state_dict(cfg, seed=0),
        episodes,
        cfg,
        TrainerConfig(max_steps=3, batch_size=4, device="cpu"),
        val_episodes=[],
    )
    assert trained.metrics["steps"] == 3 and np.isfinite(trained.metrics["loss_bc"])
    assert not any(name.startswith("object_encoder.") for name in trained.params)

"""A lockstep bridge re-sends an unanswered observation with the same stamp (a lost
best-effort sample must not stall an episode until its timeout), and still steps on the
command answering that stamp."""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import ProcessGroup  # noqa: E402


def test_unanswered_observation_is_resent_with_its_stamp(tmp_path):
    from sensor_msgs.msg import JointState

    from fed_ros.msg import ArmCommand, EpisodeStatus
    from fed_ros.ros.arm import topics as at
    from fed_ros.ros.spun_node import spun_node

    mp = pytest.MonkeyPatch()
    mp.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    mp.setenv("ROS_DOMAIN_ID", str(random.SystemRandom().randint(102, 160)))
    mp.delenv("ROS_LOCALHOST_ONLY", raising=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    group = ProcessGroup()
    node_scope = contextlib.ExitStack()
    node = node_scope.enter_context(spun_node("listener"))
    received: list[tuple[int, int, int]] = []  # (stamp, episode, step) of every status
    cond = threading.Condition()

    def on_status(msg) -> None:
        with cond:
            received.append((at.stamp_to_ns(msg.header.stamp), int(msg.episode), int(msg.step)))
            cond.notify_all()

    node.create_subscription(
        EpisodeStatus, at.EPISODE_STATUS_TOPIC, on_status, at.qos_for(at.EPISODE_STATUS_TOPIC)
    )
    joints: list[int] = []
    node.create_subscription(
        JointState,
        at.JOINT_STATES_TOPIC,
        lambda m: joints.append(at.stamp_to_ns(m.header.stamp)),
        at.qos_for(at.JOINT_STATES_TOPIC),
    )
    command_pub = node.create_publisher(
        ArmCommand, at.COMMAND_TOPIC, at.qos_for(at.COMMAND_TOPIC, subscriber=False)
    )
    try:
        group.python(
            [
                "-m",
                "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
                "--ros-args",
                "-p",
                "task:=lift",
                "-p",
                "cameras:=false",
                "-p",
                "lockstep:=true",
                "-p",
                "lockstep_republish_s:=0.3",
            ],
            env,
            log_path=tmp_path / "bridge.log",
        )
        # Nobody answers: the reset observation (step 0) arrives again and again, same stamp.
        with cond:
            assert cond.wait_for(lambda: sum(1 for r in received if r[2] == 0) >= 3, timeout=120), (
                received
            )
            stamp = received[-1][0]
        assert {r[0] for r in received if r[2] == 0} == {stamp}
        assert joints.count(stamp) >= 2  # the observation topics too, not only the status
        # Answering that stamp steps the arm once: step 1 with a new stamp.
        while command_pub.get_subscription_count() == 0:
            threading.Event().wait(0.05)
        command = ArmCommand()
        command.header.stamp = at.ns_to_stamp(stamp)
        command.action = [0.0, 0.0, 0.1]
        command.gripper = -1.0
        command_pub.publish(command)
        with cond:
            assert cond.wait_for(lambda: any(r[2] == 1 for r in received), timeout=60), received
        assert all(r[0] > stamp for r in received if r[2] == 1)
    finally:
        node_scope.close()
        group.kill_all()
        mp.undo()

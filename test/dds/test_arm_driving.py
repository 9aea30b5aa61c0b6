"""The robot node's own arm driving over real DDS: demonstrations recorded with the built-in
scripted expert are labelled as the expert's (not the policy client's), and a mirrored-mount
arm is driven from its `variation` alone (bridge negates x/y, expert commands in the arm's
frame), giving exactly the benchmark's mirrored demonstrations."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
BRIDGE_SEED = 5
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import ProcessGroup  # noqa: E402


@pytest.fixture
def mirrored_arm(tmp_path):
    """A lockstep lift bridge with a mirrored mount (no cameras) and a client node holding
    an ArmClient labelled "policy" plus a Recorder, as the robot node has them."""
    from fed_ros.ros.arm.arm_client import ArmClient
    from fed_ros.ros.arm.recorder import Recorder
    from fed_ros.ros.spun_node import spun_node

    mp = pytest.MonkeyPatch()
    mp.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    mp.setenv("ROS_DOMAIN_ID", str(random.SystemRandom().randint(102, 160)))
    mp.delenv("ROS_LOCALHOST_ONLY", raising=False)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    group = ProcessGroup()
    group.python(
        [
            "-m",
            "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
            "--ros-args",
            "-p",
            "task:=lift",
            "-p",
            "variation:=mirrored_mount",
            "-p",
            "cameras:=false",
            "-p",
            "lockstep:=true",
            "-p",
            f"seed:={BRIDGE_SEED}",
        ],
        env,
        log_path=tmp_path / "bridge.log",
    )
    try:
        with spun_node("robot", threads=3) as node:
            arm = ArmClient(node, cameras=False, source="policy")
            recorder = Recorder(node, tmp_path / "demos", robot_id="robot_9", cameras=False)
            try:
                yield arm, recorder, tmp_path / "demos"
            finally:
                recorder.destroy()
                arm.destroy()
    finally:
        group.kill_all()
        mp.undo()


def test_builtin_expert_demo_is_labelled_expert_and_mirrored(mirrored_arm):
    from rosbags.highlevel import AnyReader

    from fed_ros.bench.federation.demos import mirror_episode
    from fed_ros.ros.arm.driving import record_expert_demos
    from fed_ros.ros.arm.recorded_episodes import load_recorded_episodes
    from fed_ros.sim.collect import collect_demos

    arm, recorder, demo_dir = mirrored_arm
    ok = record_expert_demos(
        arm,
        recorder,
        ["lift"],
        1,
        0,
        demo_seed=BRIDGE_SEED,
        noise_std=0.0,
        variation="mirrored_mount",
        max_steps=150,
    )
    assert ok == 1  # the mirrored arm's expert solved it through the mirrored bridge

    [meta_file] = list(demo_dir.rglob("metadata.yaml"))
    custom = yaml.safe_load(meta_file.read_text())["rosbag2_bagfile_information"]["custom_data"]
    assert custom["source"] == "expert:lift_scripted"
    assert custom["variation"] == "mirrored_mount"
    [episode] = load_recorded_episodes(demo_dir)
    assert episode.metadata["source"] == "expert:lift_scripted"
    with AnyReader([meta_file.parent]) as reader:
        conns = [c for c in reader.connections if c.topic.endswith("arm/applied_command")]
        sources = {
            reader.deserialize(raw, c.msgtype).source for c, _, raw in reader.messages(conns)
        }
    assert sources == {"expert:lift_scripted"}
    assert yaml.safe_load(custom["command_sources"]) == {"expert:lift_scripted": len(episode)}

    # The benchmark's mirrored family: the normal arm's demo with x/y commands negated.
    [normal] = collect_demos("lift", "default", n=1, seed=BRIDGE_SEED, cameras=False)
    expected = mirror_episode(normal)
    assert len(episode) == len(expected)
    np.testing.assert_allclose(episode.actions, expected.actions, atol=1e-6)
    np.testing.assert_allclose(
        episode.observations["eef_pos"], expected.observations["eef_pos"], atol=1e-6
    )

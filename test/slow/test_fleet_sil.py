"""Simulation in the loop: the whole fleet as real processes over DDS.

Server + 4 robot nodes + 4 MuJoCo bridges (2 task families: lift, pick_place_can),
3 rounds of FedDRMan. Robots record their demonstrations by driving their arm with the
scripted expert over ROS (the recording path a real arm uses), train a low-dim policy
for a few steps per round and exchange models through the fleet topics.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fed_ros.core.checks.audit_log import read_audit_log
from fed_ros.ros.fleet.launcher import build_commands, fleet_env
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.plan import plan_fleet

ROUNDS = 3
FAMILIES = {
    "robot_0": "lift",
    "robot_1": "lift",
    "robot_2": "pick_place_can",
    "robot_3": "pick_place_can",
}


def _transfers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(420)
def test_fleet_of_four_arms_runs_feddrman_end_to_end(tmp_path, ros_env, processes):
    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "sil",
                "algorithm": "feddrman",
                "rounds": ROUNDS,
                "num_clusters": 2,
                "run_dir": str(tmp_path),
                "server": {"round_timeout_s": 300.0, "exit_when_done": False},
                "robot_defaults": {
                    "collect_demos_on_start": 2,
                    "train_max_steps": 4,
                    "register_timeout_s": 300.0,
                    "max_episode_steps": 300,
                    "trainer.val_fraction": 0.0,
                },
                "bridge": {"lockstep": True},
                "robots": [{"id": rid, "task": task} for rid, task in FAMILIES.items()],
            }
        }
    )
    env = fleet_env(base=ros_env)
    commands = build_commands(plan_fleet(config), tmp_path)
    assert len(commands) == 9  # server + 4 bridges + 4 robots
    procs = {c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path) for c in commands}

    from fed_ros.ros.operator.monitor import FleetMonitor

    with FleetMonitor() as monitor:
        deadline = time.monotonic() + 380
        while time.monotonic() < deadline:
            monitor.spin_once(0.5)
            dead = {fqn: p.returncode for fqn, p in procs.items() if p.poll() is not None}
            assert not dead, f"nodes died: {dead}; logs in {tmp_path / 'logs'}"
            if (
                monitor.announcement
                and monitor.announcement["stage"] == "done"
                and (0, ROUNDS) in monitor.models
                and (1, ROUNDS) in monitor.models
            ):
                break
        else:
            pytest.fail(
                f"fleet did not finish {ROUNDS} rounds; reports: {monitor.reports}; "
                f"logs in {tmp_path / 'logs'}"
            )
        for _ in range(10):  # let the last model chunks reach the robots
            monitor.spin_once(0.2)
        status = subprocess.run(
            [sys.executable, "-m", "fed_ros.cli", "status", "--timeout", "10"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        # EvaluatePolicy: the robot runs its current cluster model closed loop through its arm.
        from fed_ros.srv import EvaluatePolicy

        client = monitor.node.create_client(EvaluatePolicy, "/robot_0/evaluate")
        assert client.wait_for_service(timeout_sec=30)
        # Asked again only if unanswered for 120 s (a response Fast DDS dropped; service_calls).
        from fed_ros.ros.wire.service_calls import call_client_until_answered, spinning

        evaluation = call_client_until_answered(
            client,
            EvaluatePolicy.Request(episodes=1, seed=7),
            spinning(monitor.spin_once),
            attempt_s=120.0,
            timeout_s=240.0,
        )
        reports = {r["round"]: r for r in monitor.reports}
        models = dict(monitor.models)

    # Every round completed with all four updates.
    assert sorted(reports) == list(range(ROUNDS))
    for r in range(ROUNDS):
        assert reports[r]["completed"], reports[r]
        assert reports[r]["updates_accepted"] == 4 and reports[r]["updates_rejected"] == 0, reports[
            r
        ]

    # The two task families end in different clusters, each family together.
    final = {line["robot_id"]: line["cluster_ids"] for line in reports[ROUNDS - 1]["robots"]}
    assert final["robot_0"] == final["robot_1"] and final["robot_2"] == final["robot_3"], final
    assert final["robot_0"] != final["robot_2"], final

    # Each robot received its cluster's final model, byte for byte.
    for rid in FAMILIES:
        (cid,) = final[rid]
        published = models[(cid, ROUNDS)]
        assert rid in published["members"]
        received = [
            t
            for t in _transfers(tmp_path / rid / "transfers.jsonl")
            if t["kind"] == "cluster_model_received"
            and t["round"] == ROUNDS
            and t["cluster_id"] == cid
        ]
        assert received and received[-1]["sha256"] == published["sha256"], (
            rid,
            received,
            published,
        )

    # Nothing lost: every update a robot sent arrived and was accepted with the same checksum.
    audit = [
        e for e in read_audit_log(tmp_path / "server" / "audit.jsonl") if e["kind"] == "update"
    ]
    accepted = sorted((e["robot_id"], e["round"], e["sha256"]) for e in audit if e["accepted"])
    sent = sorted(
        (rid, t["round"], t["sha256"])
        for rid in FAMILIES
        for t in _transfers(tmp_path / rid / "transfers.jsonl")
        if t["kind"] == "update_sent"
    )
    assert len(sent) == 4 * ROUNDS and accepted == sent

    # Demonstrations were recorded through ROS as rosbag2/MCAP directories.
    for rid in FAMILIES:
        bags = list((tmp_path / rid / "demos").glob("*/metadata.yaml"))
        assert len(bags) >= 2 and list(bags[0].parent.glob("*.mcap")), rid

    assert evaluation is not None and evaluation.ok, evaluation
    assert list(evaluation.tasks) == ["lift"] and 0.0 <= evaluation.mean_success_rate <= 1.0

    # `fed-ros status` sees the same fleet.
    assert status.returncode == 0, status.stderr
    assert (
        "stage done" in status.stdout
        and "cluster 0:" in status.stdout
        and "cluster 1:" in status.stdout
    )


@pytest.mark.timeout(180)
def test_record_service_records_expert_demonstrations_through_the_robot_node(
    tmp_path, ros_env, processes
):
    """Teleop path: a driver calls the robot node's Record service while it drives the arm."""
    env = fleet_env(base=ros_env)
    ns = ["--ros-args", "-r", "__ns:=/robot_0"]
    processes.start(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
            *ns,
            "-r",
            "__node:=arm",
            "-p",
            "task:=lift",
            "-p",
            "cameras:=false",
            "-p",
            "lockstep:=true",
        ],
        env,
        log_path=tmp_path / "arm.log",
    )
    robot = processes.start(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.robot.robot_node",
            *ns,
            "-r",
            "__node:=robot",
            "-p",
            f"data_dir:={tmp_path / 'robot_0'}",
            "-p",
            "register_timeout_s:=600.0",
        ],
        env,
        log_path=tmp_path / "robot.log",
    )
    driver = processes.start(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.expert_driver.expert_driver_node",
            *ns,
            "-p",
            "task:=lift",
            "-p",
            "episodes:=2",
            "-p",
            "cameras:=false",
            "-p",
            "record_service:=record",
        ],
        env,
        log_path=tmp_path / "driver.log",
    )
    assert driver.wait(timeout=150) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    assert robot.poll() is None
    from fed_ros.ros.arm.recorded_episodes import load_recorded_episodes, read_recording_metadata

    bags = sorted((tmp_path / "robot_0" / "demos").glob("*/metadata.yaml"))
    assert len(bags) == 2
    meta = read_recording_metadata(bags[0].parent)["custom_data"]
    assert meta["robot_id"] == "robot_0" and meta["task"] == "lift"
    episodes = load_recorded_episodes(tmp_path / "robot_0" / "demos")
    assert episodes and all(e.task == "lift" and len(e) > 10 for e in episodes)


def test_nodes_refuse_bad_parameters_naming_them(tmp_path, ros_env):
    env = fleet_env(base=ros_env)
    server = subprocess.run(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.server.server_node",
            "--ros-args",
            "-p",
            "quorum_fraction:=1.5",
            "-p",
            f"state_dir:={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert server.returncode == 2 and "quorum_fraction" in server.stderr
    robot = subprocess.run(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.robot.robot_node",
            "--ros-args",
            "-r",
            "__ns:=/robot_0",
            "-p",
            "device:=tpu",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert robot.returncode == 2 and "'device'" in robot.stderr


@pytest.mark.timeout(180)
def test_rnd_fleet_exchanges_predictors_and_scores_before_training(tmp_path, ros_env, processes):
    """RND over ROS: DESCRIBE (predictors) -> SCORE (novelty of every peer's predictor) -> TRAIN."""
    from fed_ros.learning.dataset import synthetic_episodes

    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "rnd",
                "algorithm": "rnd",
                "rounds": 2,
                "run_dir": str(tmp_path),
                "server": {"round_timeout_s": 90.0},
                "robot_defaults": {
                    "train_max_steps": 2,
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                },
                "robots": [{"id": f"robot_{i}", "task": "lift", "sim": False} for i in range(3)],
            }
        }
    )
    for i in range(3):
        (tmp_path / f"robot_{i}" / "demos").mkdir(parents=True)
        for k, episode in enumerate(synthetic_episodes(2, length=20, seed=i, shift=3.0 * (i == 2))):
            episode.save(tmp_path / f"robot_{i}" / "demos" / f"synthetic_{k}.npz")
    env = fleet_env(base=ros_env)
    procs = {
        c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path)
        for c in build_commands(plan_fleet(config), tmp_path)
    }
    from fed_ros.ros.operator.monitor import FleetMonitor

    with FleetMonitor(track_models=False) as monitor:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not any(
            r["round"] == 1 and r["completed"] for r in monitor.reports
        ):
            monitor.spin_once(0.3)
            assert all(p.poll() is None for p in procs.values()), (
                f"a node died; logs in {tmp_path / 'logs'}"
            )
    log = (tmp_path / "logs" / "fleet__server.log").read_text()
    stages = [
        (int(m.group(1)), m.group(2))
        for m in re.finditer(r"announced round (\d+) stage (\w+)", log)
    ]
    assert [r["round"] for r in monitor.reports if r["completed"]] == [0, 1], monitor.reports
    # Round 0 is preceded by the two descriptor stages; round 1 (no reclustering) is not.
    assert stages.index((0, "describe")) < stages.index((0, "score")) < stages.index((0, "train"))
    assert (1, "describe") not in stages
    descriptors = [
        e for e in read_audit_log(tmp_path / "server" / "audit.jsonl") if e["kind"] == "descriptor"
    ]
    assert len(descriptors) == 6 and all(
        e["accepted"] for e in descriptors
    )  # 3 predictors + 3 score sets

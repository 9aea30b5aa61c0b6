"""Cameras end to end over ROS: a 2-robot fleet on the image policy, all real processes.

Server + 2 lockstep MuJoCo bridges publishing two 84x84 ``sensor_msgs/Image`` cameras + 2
robot nodes. Each robot records its demonstrations from the camera topics while its
built-in expert drives the arm (``collect_demos_on_start``), trains the image policy for a
few steps, sends its update; the server aggregates, publishes the cluster model and asks
for a closed-loop evaluation, which the robots run on the camera topics of their arms.
Sizes are the smallest that still exercise every step (2 demos, 10 steps, 1 round, 1
evaluation episode), so it runs in minutes on 2 loaded cores.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from fed_ros.core.checks.audit_log import read_audit_log
from fed_ros.ros.fleet.launcher import build_commands, fleet_env
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.plan import plan_fleet

ROBOTS = ("robot_0", "robot_1")
IMAGE_SIZE = 84  # the bridge's default and the policy's: both sides must agree


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _robot_errors(logs: Path) -> list[str]:
    return [
        line
        for log in sorted(logs.glob("*__robot.log"))
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("[ERROR]")
    ]


@pytest.mark.timeout(900)
def test_image_fleet_learns_and_evaluates_from_camera_topics(tmp_path, ros_env, processes):
    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "cameras",
                "algorithm": "fedavg",
                "rounds": 1,
                "policy": "image",
                "seed": 0,
                "run_dir": str(tmp_path),
                "server": {
                    "round_timeout_s": 600.0,
                    "registration_timeout_s": 600.0,
                    "exit_when_done": False,
                    "quorum_fraction": 1.0,
                    "evaluate_every": 1,
                    "eval_episodes": 1,
                    "eval_timeout_s": 600.0,
                },
                "strategy": {"local_steps": 10, "lr": 1e-3},
                # max_episode_steps caps both the expert's demonstrations (~50 steps for lift) and
                # the closed-loop evaluation of the barely trained policy (which runs to the cap).
                "robot_defaults": {
                    "collect_demos_on_start": 2,
                    "max_episode_steps": 120,
                    "register_timeout_s": 600.0,
                    "trainer.val_fraction": 0.0,
                    "trainer.batch_size": 8,
                    "device": "cpu",
                },
                "bridge": {"lockstep": True, "image_size": IMAGE_SIZE},
                "robots": [{"id": rid, "task": "lift"} for rid in ROBOTS],
            }
        }
    )
    env = fleet_env(base=ros_env)
    commands = build_commands(plan_fleet(config), tmp_path)
    assert len(commands) == 5  # server + 2 bridges + 2 robots
    assert all(
        c.spec.parameters["cameras"] for c in commands if c.spec.executable == "sim_bridge_node"
    )
    procs = {c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path) for c in commands}

    from fed_ros.ros.operator.monitor import FleetMonitor

    with FleetMonitor() as monitor:
        deadline = time.monotonic() + 840  # liveness only
        while True:
            monitor.spin_once(0.5)
            dead = {fqn: p.returncode for fqn, p in procs.items() if p.poll() is not None}
            assert not dead, f"nodes died: {dead}; logs in {tmp_path / 'logs'}"
            errors = _robot_errors(
                tmp_path / "logs"
            )  # a failed stage: report it now, not at the deadline
            assert not errors, errors
            reports = {r["round"]: r for r in monitor.reports}
            evaluated = 0 in reports and all(
                not math.isnan(line["success_rate"]) for line in reports[0]["robots"]
            )
            if (
                monitor.announcement
                and monitor.announcement["stage"] == "done"
                and evaluated
                and (0, 1) in monitor.models
            ):
                break
            assert time.monotonic() < deadline, (
                f"fleet did not finish; reports {monitor.reports}; logs in {tmp_path / 'logs'}"
            )
        model = monitor.models[(0, 1)]

    # Demonstrations: MCAP recordings of the arm's camera topics, decoded into image frames.
    from fed_ros.ros.arm.recorded_episodes import load_recorded_episodes, read_recording_metadata

    for rid in ROBOTS:
        bags = sorted((tmp_path / rid / "demos").glob("*/metadata.yaml"))
        assert len(bags) >= 2, rid
        meta = read_recording_metadata(bags[0].parent)
        assert meta["custom_data"]["cameras"] == "true", meta
        episodes = [e for e in load_recorded_episodes(tmp_path / rid / "demos") if e.success]
        assert len(episodes) >= 2, rid
        for episode in episodes:
            for key in ("agentview_image", "wrist_image"):
                frames = np.asarray(episode.observations[key])
                assert (
                    frames.shape == (len(episode), IMAGE_SIZE, IMAGE_SIZE, 3)
                    and frames.dtype == np.uint8
                )
                assert frames.std() > 1.0, (
                    f"{rid} {key}: blank frames"
                )  # rendered scenes, not zeros

    # The round: both image-policy updates accepted and aggregated into the cluster model.
    report = {r["round"]: r for r in monitor.reports}[0]
    assert (
        report["completed"] and report["updates_accepted"] == 2 and report["updates_rejected"] == 0
    ), report
    assert sorted(model["members"]) == list(ROBOTS), model
    audit = [
        e for e in read_audit_log(tmp_path / "server" / "audit.jsonl") if e["kind"] == "update"
    ]
    assert sorted(e["robot_id"] for e in audit if e["accepted"]) == list(ROBOTS)
    for rid in ROBOTS:
        received = [
            t
            for t in _lines(tmp_path / rid / "transfers.jsonl")
            if t["kind"] == "cluster_model_received" and t["round"] == 1
        ]
        assert received and received[-1]["sha256"] == model["sha256"], (rid, received, model)

    # The evaluation: reported to the server, run by each robot on its arm's camera frames.
    for line in report["robots"]:
        assert 0.0 <= line["success_rate"] <= 1.0, line
    for rid in ROBOTS:
        inputs = [
            t for t in _lines(tmp_path / rid / "transfers.jsonl") if t["kind"] == "rollout_inputs"
        ]
        assert inputs, f"{rid} ran no evaluation"
        assert inputs[-1]["source"] == f"policy:{model['sha256'][:12]}", inputs[
            -1
        ]  # the cluster model
        assert inputs[-1]["steps"] > 0 and inputs[-1]["camera_steps"] == inputs[-1]["steps"], (
            inputs[-1]
        )
        assert inputs[-1]["image_shape"] == [IMAGE_SIZE, IMAGE_SIZE, 3], inputs[-1]

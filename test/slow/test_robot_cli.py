"""`fed-ros robot` over real DDS: the CLI (a subprocess) operates a real robot node and arm adapter.

learning off/on reaches the robot's gate (its log says so, EvaluatePolicy is refused while off),
reset starts an episode on the arm, Record START/STOP write a recording under data_dir/demos (a
success nobody drove is refused and quarantined), estop reaches an arm adapter's
``arm/hold``, and a robot that is not there exits 2 naming the missing service.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import wait_until
from fed_ros.ros.operator import robot_cli

pytestmark = [pytest.mark.ros]


def _fed_ros() -> list[str]:
    script = Path(sys.executable).parent / "fed-ros"  # the venv's entry point
    return [str(script)] if script.exists() else [sys.executable, "-m", "fed_ros.cli"]


def fed_ros_robot(
    env: dict[str, str], domain: int, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """`fed-ros robot ARGS --domain-id DOMAIN` as the user runs it; generous discovery on a loaded
    machine."""
    return subprocess.run(
        [*_fed_ros(), "robot", *args, "--domain-id", str(domain), "--find-timeout", "60"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_fleet_file_is_told_from_a_robot_id_and_bad_usage_exits_2():
    assert robot_cli._split_fleet(["config/fleet.yaml", "ur_1", "estop"]) == (
        "config/fleet.yaml",
        ["ur_1", "estop"],
    )
    assert robot_cli._split_fleet(["ur_1", "estop"]) == (None, ["ur_1", "estop"])
    assert robot_cli.main(["1bad", "learning", "on"]) == 2
    assert robot_cli.main(["config/fleet_demo.yaml", "nobody", "learning", "on"]) == 2
    with pytest.raises(SystemExit) as exc:
        robot_cli.main(["ur_1", "learning", "maybe"])
    assert exc.value.code == 2


def test_the_domain_comes_from_the_option_else_what_fed_ros_up_recorded(tmp_path, monkeypatch):
    import argparse
    import json

    import yaml

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "fleet": {
                    "name": "lab",
                    "algorithm": "fedavg",
                    "rounds": 1,
                    "run_dir": str(tmp_path),
                    "robots": [{"id": "ur_1", "task": "lift"}],
                }
            }
        )
    )
    (tmp_path / "fleet.json").write_text(json.dumps({"domain_id": 42, "discovery_range": "SUBNET"}))
    monkeypatch.setenv("ROS_DOMAIN_ID", "0")  # both restored after the test
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    options = argparse.Namespace(domain_id=None, discovery_range=None)
    robot_cli._use_fleet_domain(str(fleet), "ur_1", options)
    assert (os.environ["ROS_DOMAIN_ID"], os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"]) == (
        "42",
        "SUBNET",
    )
    robot_cli._use_fleet_domain(
        str(fleet), "ur_1", argparse.Namespace(domain_id=7, discovery_range="LOCALHOST")
    )
    assert os.environ["ROS_DOMAIN_ID"] == "7"
    with pytest.raises(ValueError, match="not in fleet 'lab'"):
        robot_cli._use_fleet_domain(str(fleet), "fr3_1", options)


@pytest.mark.timeout(240)
def test_robot_cli_switches_learning_records_and_stops_the_arm(
    tmp_path, ros_env, ros_domain_id, processes
):
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
        ros_env,
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
            "-p",
            "max_episode_steps:=20",
        ],
        ros_env,
        log_path=tmp_path / "robot.log",
    )
    # An arm adapter without its arm (it waits for it) still serves arm/hold: its own namespace,
    # so its policy-side topics do not mix with the sim bridge's.
    processes.start(
        [
            sys.executable,
            "-m",
            "fed_ros.ros.nodes.arm_adapter.arm_adapter_node",
            "--ros-args",
            "-r",
            "__ns:=/arm_1",
            "-p",
            "profile:=ur5e",
            "-p",
            "cameras:=false",
        ],
        ros_env,
        log_path=tmp_path / "adapter.log",
    )
    robot_log = tmp_path / "robot.log"

    def cli(*args: str, code: int) -> subprocess.CompletedProcess:
        res = fed_ros_robot(ros_env, ros_domain_id, *args)
        assert res.returncode == code, (
            f"fed-ros robot {' '.join(args)}: rc {res.returncode}\n{res.stdout}"
            f"{res.stderr}\nrobot log:\n{robot_log.read_text()[-2000:]}"
        )
        return res

    # Learning gate: off, then on; the robot's own log shows each switch, in order.
    assert "learning disabled" in cli("robot_0", "learning", "off", code=0).stdout
    wait_until(
        lambda: "learning DISABLED" in robot_log.read_text(), 30, "the robot's gate to close"
    )
    refused = cli(
        "robot_0", "evaluate", "--episodes", "1", code=1
    )  # the gate refuses evaluation: exit 1
    assert "learning disabled" in refused.stderr
    assert "learning enabled" in cli("robot_0", "learning", "on", code=0).stdout
    wait_until(lambda: "learning ENABLED" in robot_log.read_text(), 30, "the robot's gate to open")
    log = robot_log.read_text()
    assert log.index("learning DISABLED") < log.index("learning ENABLED")

    # Reset starts an episode from a pip install (no ros2 service call): the arm goes home.
    reset = cli("robot_0", "reset", "--task", "lift", "--seed", "3", code=0).stdout
    assert "/robot_0/arm/reset: ok" in reset and re.search(r"episode: \d+\n", reset), reset
    assert "instruction: lift" in reset, reset
    assert cli("robot_0", "reset", "--task", "fly", code=1).returncode == 1  # unknown task

    # A success in which nobody drove the lockstep arm is refused, naming the recording, which
    # moves to demos/quarantine with its reason; the next STOP reports on its own recording.
    demos = tmp_path / "robot_0" / "demos"
    still = Path(cli("robot_0", "record", "start", code=0).stdout.split("episode: ")[1].split()[0])
    refused = cli("robot_0", "record", "stop", code=1).stderr
    assert f"recording {still}" in refused and "the arm was never driven" in refused, refused
    assert not still.exists() and (demos / "quarantine" / still.name).is_dir()
    reason = (demos / "quarantine" / f"{still.name}.reason.txt").read_text()
    assert "applied_command" in reason, reason

    # Record START (the robot's own task) and STOP of a standing arm, labelled failed (a
    # success would be converted into an episode, which needs applied commands).
    started = cli("robot_0", "record", "start", code=0).stdout
    episode = Path(started.split("episode: ")[1].split()[0])
    assert episode.parent == tmp_path / "robot_0" / "demos" and "_lift_" in episode.name
    stopped = cli("robot_0", "record", "stop", "--label", "failure", code=0).stdout
    assert (
        "saved as failed" in stopped and f"episode: {episode}" in stopped and "steps: 0" in stopped
    )
    from fed_ros.ros.arm.recorded_episodes import read_recording_metadata

    meta = read_recording_metadata(episode)["custom_data"]
    assert meta["robot_id"] == "robot_0" and meta["task"] == "lift" and meta["success"] == "false"
    again = cli(
        "robot_0", "record", "stop", code=1
    )  # answered not ok: exit 1 with the robot's message
    assert "STOP without START" in again.stderr

    # E-stop and release reach the arm adapter's arm/hold.
    assert "acknowledged by 1" in cli("arm_1", "estop", code=0).stdout
    adapter_log = tmp_path / "adapter.log"
    wait_until(
        lambda: "e-stop (arm/hold true)" in adapter_log.read_text(), 30, "the adapter's e-stop"
    )
    cli("arm_1", "estop", "--release", code=0)
    wait_until(lambda: "hold released" in adapter_log.read_text(), 30, "the adapter's hold release")

    # An evaluation between rounds (the fleet's initial model, from a stand-in server) prints
    # its intervention rate: no round report carries it.
    from support.fake_server import FakeServer

    server = FakeServer()
    try:
        server.send_model(0, None, "initial")
        transfers = tmp_path / "robot_0" / "transfers.jsonl"

        def received() -> bool:
            server.spin()
            return transfers.exists() and "cluster_model_received" in transfers.read_text()

        wait_until(received, 60, "the model at the robot")
    finally:
        server.close()
    evaluated = cli("robot_0", "evaluate", "--episodes", "1", code=0).stdout
    assert (
        "1 episode(s) per task; 0.00 interventions and 0.0 s of human control per episode, "
        "0 corrective segment(s) recorded" in evaluated
    ), evaluated
    assert re.search(r"lift: [01]\.\d\d\n", evaluated), evaluated
    assert robot.poll() is None


def test_a_missing_robot_or_adapter_exits_2_naming_what_is_missing(ros_env, ros_domain_id):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*_fed_ros(), "robot", *args, "--domain-id", str(ros_domain_id), "--find-timeout", "2"],
            env=ros_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    learning = run("robot_9", "learning", "off")
    assert learning.returncode == 2 and "/robot_9/robot/set_learning" in learning.stderr, (
        learning.stderr
    )
    hold = run("robot_9", "estop")
    assert hold.returncode == 2 and "/robot_9/arm/hold" in hold.stderr, hold.stderr


def test_every_fed_ros_robot_command_the_docs_give_parses():
    """The commands docs/arms.md and docs/teleop.md tell an operator to type are real usage."""
    import shlex

    repo = Path(__file__).resolve().parents[2]
    commands = []
    for doc in ("docs/arms.md", "docs/teleop.md"):
        text = (repo / doc).read_text()
        commands += re.findall(r"^ {4}fed-ros robot ([^#\n]+)", text, re.M)  # code blocks
        commands += re.findall(r"`fed-ros robot ([^`<|\[]+)`", text)  # inline, no placeholders
    assert len(commands) >= 8, commands
    parser = robot_cli._parser()
    for command in commands:
        fleet, rest = robot_cli._split_fleet(shlex.split(command))
        parser.parse_args(rest)  # SystemExit (exit 2) on a command the CLI does not have
    assert any(c.split()[1] == "reset" for c in commands), commands

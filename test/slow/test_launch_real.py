"""The package's launch files under the real ROS 2 launch system (`ros2 launch`), from the venv.

`make test` installs launch, launch_ros and the `ros2` command into the venv from
../shared/tools/ros2-launch when that folder exists (a test oracle, not a dependency: a full
ROS 2 install brings its own). The package is found the way a user finds it:
AMENT_PREFIX_PATH=<venv>, where `make setup` put the ament index entry, lib/fed_ros/<node>
and share/fed_ros/{launch,config}.

Checks: sim_fleet.launch.py runs a small fleet to the end; server.launch.py and
robot.launch.py as separate launches federate; SIGINT to `ros2 launch` stops every node
within launch's 5 s (no "failed to terminate"), each "finished cleanly" (exit 0), with no
error or traceback line in the output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.ros2_launch import ROS2, _launch_available, launch_env

BAD_LINE = re.compile(r"Traceback|\[ERROR\]|\[FATAL\]|Error:|failed to terminate|SystemError")


pytestmark = pytest.mark.skipif(bool(_launch_available()), reason=_launch_available() or "-")

TINY = {  # the tiny fleet of test_fleet_sil.py, smaller: low-dim, few steps, one demonstration each
    "algorithm": "fedavg",
    "rounds": 1,
    "server": {"round_timeout_s": 300.0},
    "robot_defaults": {
        "collect_demos_on_start": 1,
        "train_max_steps": 2,
        "register_timeout_s": 300.0,
        "max_episode_steps": 300,
        "trainer.val_fraction": 0.0,
        "torch_threads": 1,
    },
    "bridge": {"lockstep": True},
}


def write_fleet(tmp_path: Path, robots: int, **overrides) -> Path:
    fleet = {
        "name": "launch",
        "run_dir": str(tmp_path / "run"),
        **TINY,
        "robots": [{"id": f"robot_{i}", "task": "lift"} for i in range(robots)],
    }
    for key, value in overrides.items():
        fleet[key] = {**fleet.get(key, {}), **value} if isinstance(value, dict) else value
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"fleet": fleet}))
    return path


def start_launch(processes, env, launch_file: str, log: Path, *args: str) -> subprocess.Popen:
    return processes.start(
        [str(ROS2), "launch", "fed_ros", launch_file, *args], env, log_path=log, cwd=log.parent
    )


def wait_for(log: Path, pattern: str, timeout: float, procs) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.is_file() else ""
        if re.search(pattern, text):
            return
        for proc in procs:
            assert proc.poll() is None, (
                f"{proc.args[3]} exited {proc.returncode} (output in {log.parent})"
            )
        time.sleep(0.3)
    pytest.fail(
        f"{pattern!r} not in the launch output within {timeout:.0f} s:\n"
        f"{log.read_text(errors='replace')[-4000:] if log.is_file() else ''}"
    )


def stop_launch(proc: subprocess.Popen, log: Path, nodes: int) -> float:
    """SIGINT the launch process only (it forwards SIGINT to its nodes); check every node ended
    cleanly in time and nothing bad was printed; seconds from SIGINT to launch's exit."""
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=30)
    seconds = time.monotonic() - t0
    text = log.read_text(errors="replace")
    bad = [line for line in text.splitlines() if BAD_LINE.search(line)]
    assert not bad, (
        "bad lines in the launch output:\n" + "\n".join(bad[:30]) + f"\n---\n{text[-4000:]}"
    )
    clean = re.findall(r"process has finished cleanly", text)
    assert len(clean) == nodes, f"{len(clean)}/{nodes} nodes finished cleanly:\n{text[-4000:]}"
    assert code == 0, f"ros2 launch exited {code}:\n{text[-3000:]}"
    print(
        f"\n[launch] {log.name}: {nodes} nodes stopped, launch exited {seconds:.2f} s after SIGINT"
    )
    return seconds


@pytest.mark.timeout(300)
def test_sim_fleet_launch_runs_a_small_fleet_to_the_end(tmp_path, ros_env, processes):
    fleet = write_fleet(tmp_path, robots=2)
    log = tmp_path / "launch.log"
    proc = start_launch(
        processes, launch_env(ros_env), "sim_fleet.launch.py", log, f"fleet:={fleet}"
    )
    wait_for(log, r"federation finished", 240, [proc])
    text = log.read_text()
    for rid in ("robot_0", "robot_1"):
        assert re.search(rf"\[{rid}\.robot\]: round 0: trained \d+ steps", text), text[-4000:]
    assert re.search(r"round 0: completed", text) or "completed" in text, text[-4000:]
    stop_launch(proc, log, nodes=5)  # server + 2 bridges + 2 robots


@pytest.mark.timeout(300)
def test_server_and_robot_launches_federate_and_stop_mid_training(tmp_path, ros_env, processes):
    """Separate launches (as on separate machines); Ctrl-C while the robot trains."""
    # The strategy decides the local steps (round config): a long training to interrupt.
    fleet = write_fleet(
        tmp_path,
        robots=1,
        robot_defaults={"train_max_steps": 100000},
        strategy={"local_steps": 100000},
    )
    env = launch_env(ros_env)
    server_log, robot_log = tmp_path / "server" / "launch.log", tmp_path / "robot" / "launch.log"
    server_log.parent.mkdir()
    robot_log.parent.mkdir()
    server = start_launch(processes, env, "server.launch.py", server_log, f"fleet:={fleet}")
    robot = start_launch(
        processes, env, "robot.launch.py", robot_log, f"fleet:={fleet}", "robot_id:=robot_0"
    )
    wait_for(server_log, r"register 'robot_0': accepted", 240, [server, robot])
    # The robot received round 0's model and has trained for ~10 s (its progress line).
    wait_for(robot_log, r"round 0: training, step \d+", 120, [server, robot])
    stop_launch(robot, robot_log, nodes=2)  # bridge + robot, mid-training
    stop_launch(server, server_log, nodes=1)  # server, mid-round

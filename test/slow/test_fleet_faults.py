"""Fleet fault tolerance with real processes: a robot killed mid-round, a robot killed
mid-training and restarted, the server killed and restarted, `fed-ros up` noticing a dead node
and shutting down cleanly on Ctrl-C.

Robots here train on small synthetic demonstration files (no simulator) so the tests
spend their time on the protocol, not on MuJoCo.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fed_ros.core.rounds.store import ModelStore
from fed_ros.ros.fleet.launcher import fleet_env
from support.fault_fleet import _fleet, _wait


@pytest.mark.timeout(240)
def test_robot_killed_mid_round_round_completes_at_quorum(tmp_path, ros_env, processes):
    commands = _fleet(tmp_path, robots=3, rounds=1, quorum_fraction=0.6, round_timeout_s=45.0)
    env = fleet_env(base=ros_env)
    procs = {c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    from fed_ros.ros.operator.monitor import FleetMonitor

    with FleetMonitor(track_models=False) as monitor:
        _wait(
            monitor,
            lambda: monitor.announcement is not None and monitor.announcement["stage"] == "train",
            120,
            procs,
            "round 0",
        )
        assert (
            monitor.announcement["quorum"] == 2 and len(monitor.announcement["participants"]) == 3
        )
        os.killpg(procs["/robot_2/robot"].pid, signal.SIGKILL)  # dies while the round is open
        _wait(
            monitor,
            lambda: bool(monitor.reports),
            120,
            procs,
            "round 0 report",
            allow_dead=("/robot_2/robot",),
        )
    report = monitor.reports[0]
    assert report["completed"] and report["updates_accepted"] == 2, report
    robots = {r["robot_id"]: r for r in report["robots"]}
    assert not robots["robot_2"]["accepted"] and "straggler" in robots["robot_2"]["reason"]
    assert robots["robot_0"]["accepted"] and robots["robot_1"]["accepted"]
    assert ModelStore(tmp_path / "server").load_latest().round_idx == 0


def _log_has(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


@pytest.mark.timeout(300)
def test_robot_killed_mid_training_and_restarted_rejoins_with_its_key(tmp_path, ros_env, processes):
    # robot_1's 2 steps take 4 s each, so the kill lands inside its training, not after its
    # update was sent; the round waits 60 s, long enough for the restarted robot to answer.
    commands = _fleet(
        tmp_path,
        robots=2,
        rounds=2,
        quorum_fraction=0.5,
        robot_params={"robot_1": {"train_step_delay_s": 4.0}},
    )
    env = fleet_env(base=ros_env)
    procs = {c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    robot_1 = next(c for c in commands if c.spec.fqn == "/robot_1/robot")
    server_log = next(c.log_path for c in commands if c.spec.fqn == "/fleet/server")
    from fed_ros.ros.operator.monitor import FleetMonitor

    with FleetMonitor(track_models=False) as monitor:
        _wait(  # its first heartbeat: sent when training starts
            monitor,
            lambda: _log_has(server_log, "round 0: robot_1 at step 0 of 2"),
            120,
            procs,
            "robot_1 to start training in round 0",
        )
        os.killpg(procs["/robot_1/robot"].pid, signal.SIGKILL)  # power loss while training
        procs["/robot_1/robot"].wait(timeout=10)
        restart_log = tmp_path / "logs" / "robot_1_restart.log"
        procs["/robot_1/robot"] = processes.start(robot_1.argv, env, log_path=restart_log)
        _wait(
            monitor,
            lambda: any(r["round"] == 1 and r["completed"] for r in monitor.reports),
            240,
            procs,
            "both rounds after the restart",
        )
    assert "trained" not in robot_1.log_path.read_text()  # killed before its update left
    reports = {r["round"]: {x["robot_id"]: x for x in r["robots"]} for r in monitor.reports}
    # Round 0 resumes: the restarted robot sees the round still open (the announcement is
    # TRANSIENT_LOCAL), re-registers, trains again and its update is accepted in that round.
    assert reports[0]["robot_1"]["accepted"], reports[0]
    # Round 1: a full participant again, its update accepted under its own key.
    assert reports[1]["robot_1"]["accepted"], reports[1]
    assert reports[1]["robot_0"]["accepted"], reports[1]
    text = restart_log.read_text(errors="replace")
    assert "ERROR" not in text and "Traceback" not in text, text[-3000:]
    registrations = server_log.read_text().count("register 'robot_1': accepted")
    assert registrations == 2, server_log.read_text()[-3000:]
    assert ModelStore(tmp_path / "server").load_latest().round_idx == 1


@pytest.mark.timeout(300)
def test_server_killed_and_restarted_resumes_with_identical_models(tmp_path, ros_env, processes):
    # Model bytes on the zmq bulk channel here (the ROS-chunk path runs in the other tests).
    commands = _fleet(tmp_path, robots=2, rounds=3, channel="zmq")
    env = fleet_env(base=ros_env)
    procs = {c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    server = next(c for c in commands if c.spec.fqn == "/fleet/server")
    from fed_ros.ros.operator.monitor import FleetMonitor

    with FleetMonitor() as monitor:
        _wait(
            monitor,
            lambda: (
                any(r["round"] == 0 and r["completed"] for r in monitor.reports)
                and (0, 1) in monitor.models
            ),
            150,
            procs,
            "round 0 committed",
        )
        before = monitor.models[(0, 1)]["sha256"]
        committed = ModelStore(tmp_path / "server").load_latest()
        assert committed.round_idx == 0
        # Kill the server while round 1 is in flight (robots are training or uploading).
        os.killpg(procs["/fleet/server"].pid, signal.SIGKILL)
        procs["/fleet/server"].wait(timeout=10)
        seen = len(monitor.model_log)
        procs["/fleet/server"] = processes.start(
            server.argv, env, log_path=tmp_path / "logs" / "server_restart.log"
        )
        _wait(
            monitor,
            lambda: any(m[:2] == (0, 1) for m in monitor.model_log[seen:]),
            90,
            procs,
            "models republished after the restart",
        )
        republished = [m[2] for m in monitor.model_log[seen:] if m[:2] == (0, 1)]
        assert republished[0] == before  # resumed from the committed round: identical model
        _wait(
            monitor,
            lambda: any(r["round"] == 2 and r["completed"] for r in monitor.reports),
            150,
            procs,
            "the remaining rounds after the restart",
        )
    log = (tmp_path / "logs" / "server_restart.log").read_text()
    assert "resumed after committed round 0" in log
    sent = [
        json.loads(line)
        for line in (tmp_path / "robot_0" / "transfers.jsonl").read_text().splitlines()
    ]
    assert {t["channel"] for t in sent if t["kind"] == "update_sent"} == {"zmq"}
    final = ModelStore(tmp_path / "server").load_latest()
    assert final.round_idx == 2
    reports = {r["round"]: r for r in monitor.reports if r["completed"]}
    assert set(reports) == {0, 1, 2}


@pytest.mark.timeout(120)
def test_fed_ros_up_exits_nonzero_when_a_node_dies_and_cleanly_on_ctrl_c(tmp_path, ros_env):
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        yaml.safe_dump(
            {
                "fleet": {
                    "name": "up",
                    "algorithm": "fedavg",
                    "rounds": 1,
                    "run_dir": str(tmp_path / "run"),
                    "robots": [{"id": "robot_0", "task": "lift", "sim": False}],
                }
            }
        )
    )
    env = dict(ros_env)

    def up() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "fed_ros.cli", "up", str(fleet_file), "--robots", ""],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def node_pids(timeout: float = 30.0) -> dict[str, int]:
        state = tmp_path / "run" / "fleet.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if state.is_file():
                try:
                    return json.loads(state.read_text())["pids"]
                except (ValueError, KeyError):
                    pass
            time.sleep(0.2)
        raise AssertionError("fed-ros up wrote no fleet.json")

    log = tmp_path / "run" / "logs" / "fleet__server.log"

    def wait_running(timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.is_file() and "fleet server:" in log.read_text():
                return
            time.sleep(0.2)
        raise AssertionError(
            f"server did not start: {log.read_text() if log.is_file() else 'no log'}"
        )

    # A node dies -> `fed-ros up` stops the rest and exits 1.
    proc = up()
    try:
        pids = node_pids()
        assert list(pids) == ["/fleet/server"]
        wait_running()
        os.kill(pids["/fleet/server"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1, out
        assert "node /fleet/server exited with code -9" in out
        state = json.loads((tmp_path / "run" / "fleet.json").read_text())
        assert state["discovery_range"] == "LOCALHOST" and 1 <= state["domain_id"] <= 101
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Ctrl-C -> every node stopped, exit 0, a log per node.
    (tmp_path / "run" / "fleet.json").unlink()
    log.unlink()
    proc = up()
    try:
        pids = node_pids()
        wait_running()
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "/fleet/server=0" in out  # the node itself shut down cleanly on SIGINT
        for pid in pids.values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

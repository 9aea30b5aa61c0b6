"""Liveness beyond deadlines over real DDS (issue 26 item 2): a slow robot kept in the fleet.

Two real robot nodes train on fixed demonstrations (no arm) against the real server. robot_1 is
throttled (``train_step_delay_s``: 0.6 s after each of its 20 steps, >= 12 s per round) while the
announced deadline is 8 s after the announcement and robot_0 needs about 2 s: robot_1 is at
least 5x slower than robot_0 and cannot make the announced deadline.

- With heartbeats (every 1 s; the server's extension runs out 4 s after the last one): robot_1's
  update is accepted in every round, after the announced deadline.
- With heartbeats off (``heartbeat_period_s: 0``), the same fleet drops robot_1 as a straggler
  every round and aggregates robot_0's update alone.
- Hostile heartbeats published into that fleet (a robot that is not a participant; progress
  beyond the round's step budget; a replayed sequence number) are refused, each with its reason
  in the server's audit log, and extend nothing.

The link-outage half (a robot whose link is down for 2x the heartbeat period is not declared
dead) runs across network namespaces in test_heartbeats_outage.py.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from conftest import wait_until

rclpy = pytest.importorskip("rclpy")

ROBOTS = ("robot_0", "robot_1")
ROUNDS = 2
LOCAL_STEPS = 20
STEP_DELAY_S = 0.6  # robot_1: >= 12 s of training per round
ROUND_TIMEOUT_S = 8.0


def _start_fleet(tmp_path, ros_env, processes, heartbeat_period_s: float):
    from fed_ros.learning.dataset import synthetic_episodes
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
    from fed_ros.ros.fleet.launcher import build_commands, fleet_env
    from fed_ros.ros.fleet.plan import plan_fleet

    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "heartbeats",
                "algorithm": "fedavg",
                "rounds": ROUNDS,
                "run_dir": str(tmp_path),
                "strategy": {"local_steps": LOCAL_STEPS, "lr": 1e-3},
                "server": {
                    "round_timeout_s": ROUND_TIMEOUT_S,
                    "quorum_fraction": 0.5,
                    "heartbeat_timeout_s": 4.0,
                    "max_deadline_extension_s": 120.0,
                    "exit_when_done": True,
                },
                "robot_defaults": {
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                    "heartbeat_period_s": heartbeat_period_s,
                },
                "robots": [
                    {"id": "robot_0", "task": "lift", "sim": False},
                    {
                        "id": "robot_1",
                        "task": "lift",
                        "sim": False,
                        "parameters": {"train_step_delay_s": STEP_DELAY_S},
                    },
                ],
            }
        }
    )
    for k, rid in enumerate(ROBOTS):  # demonstrations on disk: training needs no arm
        (tmp_path / rid / "demos").mkdir(parents=True)
        for j, episode in enumerate(synthetic_episodes(2, length=20, seed=k)):
            episode.save(tmp_path / rid / "demos" / f"synthetic_{j}.npz")
    commands = [
        c
        for c in build_commands(plan_fleet(config, include_server=True), tmp_path)
        if c.spec.executable != "arm_adapter_node"
    ]
    env = fleet_env(base=ros_env)
    procs = {c.spec.executable: processes.start(c.argv, env, log_path=c.log_path) for c in commands}
    server_log = next(c.log_path for c in commands if c.spec.executable == "server_node")
    return procs["server_node"], server_log


def _audit(tmp_path) -> list[dict]:
    path = tmp_path / "server" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _accepted_updates(tmp_path, round_idx: int) -> list[str]:
    return sorted(
        e["robot_id"]
        for e in _audit(tmp_path)
        if e["kind"] == "update" and e["round"] == round_idx and e["accepted"]
    )


def _wait_done(server, server_log) -> str:
    wait_until(
        lambda: server.poll() is not None,
        300,
        "the federation to finish",
        diagnostics=lambda: server_log.read_text()[-3000:],
    )
    log = server_log.read_text()
    assert server.returncode == 0, log[-3000:]
    return log


class _Forger:
    """Publishes TrainingProgress heartbeats from this process (an attacker on the domain)."""

    def __init__(self) -> None:
        from fed_ros.msg import TrainingProgress
        from fed_ros.ros.wire import qos

        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("forger", context=self.context)
        self.msg_type = TrainingProgress
        self.pub = self.node.create_publisher(
            TrainingProgress, "/fleet/training_progress", qos.heartbeat_qos()
        )

    def send(self, **fields) -> None:
        for _ in range(3):  # best effort: a few copies, the server refuses each alike
            self.pub.publish(self.msg_type(**fields))
            time.sleep(0.05)

    def close(self) -> None:
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


@pytest.mark.timeout(420)
def test_heartbeats_keep_a_slow_robot_in_every_round(tmp_path, ros_env, processes):
    server, server_log = _start_fleet(tmp_path, ros_env, processes, heartbeat_period_s=1.0)
    forger = _Forger()
    try:
        # Once round 0 trains, hostile heartbeats arrive beside robot_1's honest ones.
        wait_until(
            lambda: (
                any(e["kind"] == "update" for e in _audit(tmp_path))
                or "heartbeats arriving" in server_log.read_text()
            ),
            240,
            "round 0 training heartbeats",
            diagnostics=lambda: server_log.read_text()[-3000:],
        )
        forger.send(robot_id="intruder", round=0, seq=1, steps_done=1, expected_steps=LOCAL_STEPS)
        forger.send(
            robot_id="robot_1", round=0, seq=10**6, steps_done=5, expected_steps=LOCAL_STEPS + 1
        )
        forger.send(robot_id="robot_1", round=0, seq=1, steps_done=1, expected_steps=LOCAL_STEPS)
        log = _wait_done(server, server_log)
    finally:
        forger.close()
    for r in range(ROUNDS):
        assert _accepted_updates(tmp_path, r) == list(ROBOTS), (r, log[-3000:])
    assert "straggler" not in log, log[-3000:]
    extended = re.findall(r"robot_1 at step \d+ of 20: deadline extended", log)
    assert len(extended) >= ROUNDS, log[-3000:]  # its updates came after the announced deadline
    refused = {(e["robot_id"], e["code"]) for e in _audit(tmp_path) if e["kind"] == "heartbeat"}
    assert ("intruder", "not_participant") in refused, refused
    assert ("robot_1", "step_budget") in refused, refused
    assert ("robot_1", "replay") in refused, refused  # seq 1 after robot_1's own later ones
    reasons = [e["reason"] for e in _audit(tmp_path) if e["kind"] == "heartbeat"]
    assert any("step budget is 20" in r for r in reasons), reasons


@pytest.mark.timeout(300)
def test_without_heartbeats_the_slow_robot_is_dropped(tmp_path, ros_env, processes):
    server, server_log = _start_fleet(tmp_path, ros_env, processes, heartbeat_period_s=0.0)
    log = _wait_done(server, server_log)
    for r in range(ROUNDS):
        assert _accepted_updates(tmp_path, r) == ["robot_0"], (r, log[-3000:])
    assert len(re.findall(r"straggler\(s\) dropped: robot_1", log)) == ROUNDS, log[-3000:]
    assert "heartbeats arriving" not in log

"""The fleet encoder stage over real DDS (issue 37 items 1 and 4): the real server and robot
nodes, robots with recorded camera episodes on disk (synthetic 84x84 frames: the cheapest
robots with cameras; training needs no arm).

The smoke test: server + 2 robots, ``encoder_rounds: 1`` of 3 steps, then 1 policy round on the
frozen fleet trunk. A hostile encoder update (NaN) sent in robot_0's name while the robots
train is refused and never reaches the encoder; both robots end with the server's committed
encoder, byte for byte; the policy round completes; the round report and TensorBoard carry
the encoder rounds' bytes and CPU seconds per robot.

The late joiner: robot_1 starts after the encoder was committed; it gets the current encoder
from the latched topic and trains its first policy round on it (never on its placeholder).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import wait_until

rclpy = pytest.importorskip("rclpy")

ROBOTS = ("robot_0", "robot_1")
ENCODER_STEPS = 3


def _config(tmp_path: Path, server: dict, robot_params: dict | None = None) -> object:
    from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict

    return fleet_config_from_dict(
        {
            "fleet": {
                "name": "encoder",
                "algorithm": "fedavg",
                "rounds": 1,
                "policy": "image",
                "vision_backbone": "fleet",
                "run_dir": str(tmp_path),
                "strategy": {"local_steps": 3, "lr": 1e-3},
                "server": {
                    "round_timeout_s": 240.0,
                    "exit_when_done": True,
                    "encoder_rounds": 1,
                    "encoder.local_steps": ENCODER_STEPS,
                    "encoder.batch_size": 8,
                    **server,
                },
                "robot_defaults": {
                    "torch_threads": 1,
                    "device": "cpu",
                    "trainer.val_fraction": 0.0,
                    "trainer.batch_size": 4,
                },
                "robots": [
                    {"id": rid, "task": "lift", "sim": False, **(robot_params or {}).get(rid, {})}
                    for rid in ROBOTS
                ],
            }
        }
    )


def _demos(tmp_path: Path) -> None:
    from fed_ros.learning.dataset import synthetic_episodes

    for k, rid in enumerate(ROBOTS):  # camera demonstrations on disk
        demos = tmp_path / rid / "demos"
        demos.mkdir(parents=True)
        for j, episode in enumerate(synthetic_episodes(2, length=12, kind="image", seed=k)):
            episode.save(demos / f"synthetic_{j}.npz")


def _commands(config, tmp_path: Path) -> dict:
    from fed_ros.ros.fleet.launcher import build_commands
    from fed_ros.ros.fleet.plan import plan_fleet

    return {
        (c.spec.namespace.strip("/") if c.spec.executable == "robot_node" else "server"): c
        for c in build_commands(plan_fleet(config), tmp_path)
        if c.spec.executable in ("server_node", "robot_node")
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tails(commands: dict) -> str:
    return "\n".join(
        f"--- {name}\n{c.log_path.read_text(errors='replace')[-2500:]}"
        for name, c in commands.items()
        if c.log_path.exists()
    )


class _Observer:
    """An rclpy node in the test: the server's round reports, and a hostile robot's voice."""

    def __init__(self) -> None:
        from rclpy.executors import SingleThreadedExecutor

        from fed_ros.msg import EncoderUpdate, FleetEncoder, RoundReport
        from fed_ros.ros.nodes.server.server_node import REPORT_HISTORY
        from fed_ros.ros.wire import qos

        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("encoder_test_observer", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.reports: dict[int, object] = {}
        self.encoders: list[object] = []
        self.node.create_subscription(
            RoundReport,
            "/fleet/round_report",
            lambda m: self.reports.__setitem__(int(m.round), m),
            qos.model_state_qos(REPORT_HISTORY),
        )
        self.node.create_subscription(
            FleetEncoder, "/fleet/encoder", self.encoders.append, qos.latched_qos()
        )
        self.hostile_pub = self.node.create_publisher(
            EncoderUpdate, "/fleet/encoder_updates", qos.control_qos()
        )

    def spin(self) -> None:
        self.executor.spin_once(timeout_sec=0.05)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.ctx)


@pytest.fixture
def observer(ros_env):
    obs = _Observer()
    try:
        yield obs
    finally:
        obs.close()


def _send_nan_encoder(observer: _Observer, encoder_msg) -> None:
    """An encoder update in robot_0's name whose tensors hold a NaN (shape and bytes right)."""
    from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
    from fed_ros.learning.fleet_encoder import initial_encoder_state
    from fed_ros.msg import EncoderUpdate
    from fed_ros.ros.wire.encoder_msgs import encoder_payload

    state = initial_encoder_state(FleetEncoderConfig(**json.loads(encoder_msg.config_json)))
    first = next(iter(state))
    state[first] = state[first].copy()
    state[first].reshape(-1)[0] = np.nan
    observer.hostile_pub.publish(
        EncoderUpdate(
            robot_id="robot_0",
            version=encoder_msg.version,
            num_samples=10,
            loss_first=1.0,
            loss_last=1.0,
            cpu_seconds=1.0,
            payload=encoder_payload(state, "hostile"),
        )
    )


@pytest.mark.timeout(420)
def test_two_robots_train_the_fleet_encoder_then_a_policy_round_on_it(
    tmp_path, ros_env, processes, observer
):
    from fed_ros.core.checks.audit_log import read_audit_log
    from fed_ros.core.rounds.store import ModelStore
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict
    from fed_ros.ros.fleet.launcher import fleet_env
    from support.tb_events import read_scalars

    config = _config(tmp_path, {})
    _demos(tmp_path)
    commands = _commands(config, tmp_path)
    procs = {
        name: processes.start(c.argv, fleet_env(base=ros_env), log_path=c.log_path)
        for name, c in commands.items()
    }

    def asked():  # the encoder round's announcement: both robots asked to train version 0
        observer.spin()
        return next((m for m in observer.encoders if list(m.participants) == list(ROBOTS)), None)

    announced = wait_until(asked, 240, "the encoder round", diagnostics=lambda: _tails(commands))
    _send_nan_encoder(observer, announced)
    server = procs["server"]

    def done():
        observer.spin()
        return server.poll() is not None and 0 in observer.reports

    wait_until(done, 300, "the encoder and policy rounds", diagnostics=lambda: _tails(commands))
    log = commands["server"].log_path.read_text()
    assert server.returncode == 0, _tails(commands)
    assert "fleet encoder version 1: 2 robots averaged by frames" in log, log[-3000:]
    assert "round 0: completed (2/2 updates" in log, log[-3000:]

    # The hostile update was refused; the committed encoder is the robots' average, finite.
    refused = [
        e
        for e in read_audit_log(tmp_path / "server" / "audit.jsonl")
        if e["kind"] == "encoder_update"
    ]
    assert [(e["robot_id"], e["accepted"], e["code"]) for e in refused][0] == (
        "robot_0",
        False,
        "non_finite",
    ), refused
    assert sorted((e["robot_id"], e["accepted"]) for e in refused[1:]) == [
        ("robot_0", True),
        ("robot_1", True),
    ]
    encoder = ModelStore(tmp_path / "server" / "encoder").load_latest()
    assert encoder.round_idx == 1 and sorted(encoder.meta["averaged"]) == list(ROBOTS)
    assert all(np.isfinite(v).all() for v in encoder.cluster_models[0].values())

    # Both robots hold the server's committed encoder as their fleet backbone, byte for byte.
    server_file = tmp_path / "server" / "encoder" / "fleet_encoder.safetensors"
    robot_files = [tmp_path / rid / "models" / "fleet_encoder.safetensors" for rid in ROBOTS]
    assert {_sha(f) for f in robot_files} == {_sha(server_file)}
    # The policy round trained on the frozen fleet trunk (left out of the federated model).
    policy = ModelStore(tmp_path / "server").load_latest()
    want = initial_state_dict(
        PolicyConfig(kind="image", vision_backbone="fleet", backbone_weights=str(server_file))
    )
    assert set(policy.cluster_models[0]) == set(want)

    # Deliverable 4: the encoder rounds' bytes and CPU per robot, in the report and TensorBoard.
    report = observer.reports[0]
    diag = dict(zip(report.diagnostic_names, report.diagnostic_values))
    payload = sum(v.nbytes for v in encoder.cluster_models[0].values())
    assert diag["encoder.version"] == 1.0
    assert diag["encoder.bytes_per_robot"] == 2 * payload  # float32 down and up
    for rid in ROBOTS:
        assert diag[f"encoder.{rid}/bytes"] == 2 * payload
        assert 0.0 < diag[f"encoder.{rid}/cpu_s"] < 600.0
        assert diag[f"encoder.{rid}/frames"] == 24.0  # 2 episodes x 12 frames
    assert 0.0 < diag["encoder.cpu_s_per_robot"] and math.isfinite(diag["encoder.loss_last"])
    scalars = read_scalars(tmp_path / "tb" / "server")
    assert scalars["encoder/bytes_per_robot"] == [(1, 2.0 * payload)]
    assert scalars["encoder/cpu_s_per_robot"][0][0] == 1


@pytest.mark.timeout(420)
def test_a_robot_joining_after_the_encoder_round_gets_it_before_it_trains(
    tmp_path, ros_env, processes
):
    from fed_ros.ros.fleet.launcher import fleet_env

    # robot_0 alone starts the fleet; its slow policy steps (8 s each) keep round 0 open
    # while robot_1 starts; round 1 needs both (quorum_fraction 1).
    config = _config(
        tmp_path,
        {"rounds": 2, "expected_robots": [""], "min_robots": 1, "quorum_fraction": 1.0},
        {"robot_0": {"parameters": {"train_step_delay_s": 8.0}}},
    )
    _demos(tmp_path)
    commands = _commands(config, tmp_path)
    env = fleet_env(base=ros_env)
    server = processes.start(commands["server"].argv, env, log_path=commands["server"].log_path)
    processes.start(commands["robot_0"].argv, env, log_path=commands["robot_0"].log_path)
    server_log = commands["server"].log_path
    wait_until(
        lambda: "fleet encoder version 1:" in server_log.read_text(),
        240,
        "the encoder round of robot_0",
        diagnostics=lambda: _tails(commands),
    )
    processes.start(commands["robot_1"].argv, env, log_path=commands["robot_1"].log_path)
    wait_until(
        lambda: server.poll() is not None, 300, "two rounds", diagnostics=lambda: _tails(commands)
    )
    log = server_log.read_text()
    assert server.returncode == 0, _tails(commands)
    assert "fleet encoder version 1: 1 robots averaged" in log, log[-3000:]
    assert "round 1: completed (2/2 updates" in log, log[-3000:]  # robot_1 trained round 1

    late = commands["robot_1"].log_path.read_text()
    saved = late.find("fleet encoder version 1 saved")
    trained = late.find("round 1: trained")
    assert 0 <= saved < trained, late[-3000:]
    assert "fleet encoder version 1: trained" not in late  # it joined after that round
    server_file = tmp_path / "server" / "encoder" / "fleet_encoder.safetensors"
    assert _sha(tmp_path / "robot_1" / "models" / "fleet_encoder.safetensors") == _sha(server_file)

"""Benchmark numbers are fleet numbers: the same seeded 2-robot, 2-round federation run by
`fed-ros bench federation`'s in-process round (`federation_round`) and over ROS by real server
and robot node processes ends with bit-identical cluster models (fedavg, fedprox, feddrman).

Robots train on fixed demos written as Episode .npz files into their data_dir/demos (no
simulator, no evaluation). A FedProx fleet file's mu reaches the robots' training: its
result equals the in-process run with that mu and differs from the run with mu = 0.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from fed_ros.core.data.episode import Episode
from fed_ros.core.rounds.store import ModelStore
from fed_ros.ros.fleet.launcher import build_commands, fleet_env
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.plan import plan_fleet

ROBOTS = ("robot_0", "robot_1")
ROUNDS = 2
TRAINING = {"local_steps": 10, "lr": 1e-3}  # strategy settings: every robot's round config


def _write_demos(run_dir: Path) -> None:
    from fed_ros.learning.dataset import synthetic_episodes

    for i, rid in enumerate(ROBOTS):
        demos = run_dir / rid / "demos"
        demos.mkdir(parents=True)
        for k, episode in enumerate(synthetic_episodes(2, length=20, seed=i, shift=2.0 * i)):
            episode.save(demos / f"demo_{k}.npz")


def _fleet_config(run_dir: Path, algorithm: str, strategy: dict):
    return fleet_config_from_dict(
        {
            "fleet": {
                "name": "equivalence",
                "algorithm": algorithm,
                "rounds": ROUNDS,
                "num_clusters": 2,
                "seed": 0,
                "run_dir": str(run_dir),
                "strategy": strategy,
                "server": {"round_timeout_s": 120.0, "exit_when_done": True},
                "robot_defaults": {
                    "device": "cpu",
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                    "register_timeout_s": 120.0,
                    "collect_demos_on_start": 0,
                },
                "robots": [{"id": rid, "task": "lift", "sim": False} for rid in ROBOTS],
            }
        }
    )


def _over_ros(run_dir: Path, config, ros_env, processes) -> dict[int, dict[str, np.ndarray]]:
    """Run the fleet as real processes until the server finishes; its committed cluster models."""
    env = fleet_env(base=ros_env)
    procs = {
        c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path)
        for c in build_commands(plan_fleet(config), run_dir)
    }
    server = procs["/fleet/server"]
    deadline = time.monotonic() + 150
    while server.poll() is None and time.monotonic() < deadline:
        dead = {
            fqn: p.returncode
            for fqn, p in procs.items()
            if p is not server and p.poll() is not None
        }
        assert not dead, f"robot nodes died: {dead}; logs in {run_dir / 'logs'}"
        time.sleep(0.2)
    assert server.poll() == 0, f"server did not finish {ROUNDS} rounds; logs in {run_dir / 'logs'}"
    snap = ModelStore(run_dir / "server").load_latest()
    assert snap is not None and snap.round_idx == ROUNDS - 1
    return {int(c): dict(m) for c, m in snap.cluster_models.items()}


def _in_process(run_dir: Path, config) -> dict[int, dict[str, np.ndarray]]:
    """The benchmark's round, fed the same fleet file: strategy, initial model, seeds, demos."""
    from fed_ros.bench.federation.run import federation_round, make_clients
    from fed_ros.core.strategies.base import make_strategy
    from fed_ros.learning.configuration_policy import PolicyConfig
    from fed_ros.learning.trainer import initial_state_dict

    policy_cfg = PolicyConfig(kind=config.policy)
    settings = dict(config.strategy)
    if config.algorithm == "feddrman":
        settings["num_clusters"] = config.num_clusters
    strategy = make_strategy(config.algorithm, **settings)
    strategy.initialize(initial_state_dict(policy_cfg, seed=config.seed), list(ROBOTS))
    data = {
        rid: [Episode.load(f) for f in sorted((run_dir / rid / "demos").glob("*.npz"))]
        for rid in ROBOTS
    }
    clients = make_clients(
        ROBOTS, policy_cfg, config.seed
    )  # the bench's robots: BENCH_LOCAL settings
    for r in range(ROUNDS):
        federation_round(strategy, clients, data, r)
    return {
        int(c): {k: np.array(v) for k, v in m.items()} for c, m in strategy.cluster_models().items()
    }


def _assert_same_models(fleet: dict, bench: dict) -> None:
    assert sorted(fleet) == sorted(bench)
    for cid in bench:
        assert list(fleet[cid]) == list(bench[cid])
        for key, value in bench[cid].items():
            # Same float path (same seeds, threads, order): bit-identical.
            np.testing.assert_array_equal(
                fleet[cid][key], value, err_msg=f"cluster {cid} tensor {key}"
            )


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "algorithm,strategy",
    [
        ("fedavg", {}),
        ("feddrman", {}),
    ],
)
def test_fleet_and_bench_end_with_the_same_cluster_models(
    tmp_path, ros_env, processes, torch_one_thread, algorithm, strategy
):
    _write_demos(tmp_path)
    config = _fleet_config(tmp_path, algorithm, {**TRAINING, **strategy})
    bench = _in_process(tmp_path, config)
    fleet = _over_ros(tmp_path, config, ros_env, processes)
    _assert_same_models(fleet, bench)
    if algorithm == "feddrman":
        assert len(bench) == 2  # two clusters: CUA really separated the robots


@pytest.mark.timeout(240)
def test_fedprox_fleet_trains_with_the_fleet_files_mu_over_ros(
    tmp_path, ros_env, processes, torch_one_thread
):
    _write_demos(tmp_path)
    config = _fleet_config(tmp_path, "fedprox", {**TRAINING, "mu": 0.5})
    fleet = _over_ros(tmp_path, config, ros_env, processes)
    _assert_same_models(fleet, _in_process(tmp_path, config))
    # The proximal term was active: with mu = 0 the same federation ends elsewhere.
    without_mu = _in_process(
        tmp_path, _fleet_config(tmp_path / "mu0", "fedprox", {**TRAINING, "mu": 0.0})
    )
    assert any(not np.array_equal(fleet[0][k], without_mu[0][k]) for k in fleet[0])
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*robot*.log"))
    assert logs.count("prox_mu=0.5") >= 2 * ROUNDS  # each robot logs the round config it obeys

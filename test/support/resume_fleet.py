"""A small fleet run to the end, and what its robots and server finished with: shared by the resume
and breakage tests."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from fed_ros.core.rounds.store import ModelStore
from fed_ros.ros.fleet.launcher import build_commands, fleet_env
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.plan import plan_fleet


ROBOTS = ("robot_0", "robot_1")


ROUNDS = 3


def _fleet(run_dir: Path):
    from fed_ros.learning.dataset import synthetic_episodes

    for i, rid in enumerate(ROBOTS):
        demos = run_dir / rid / "demos"
        demos.mkdir(parents=True)
        for k, episode in enumerate(synthetic_episodes(2, length=20, seed=i, shift=2.0 * i)):
            episode.save(demos / f"demo_{k}.npz")
    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "resume",
                "algorithm": "fedavg",
                "rounds": ROUNDS,
                "seed": 0,
                "run_dir": str(run_dir),
                "strategy": {"local_steps": 10, "lr": 1e-3},
                "server": {"round_timeout_s": 300.0, "exit_when_done": True},
                "robot_defaults": {
                    "device": "cpu",
                    "torch_threads": 1,
                    "trainer.val_fraction": 0.0,
                    "register_timeout_s": 120.0,
                    "collect_demos_on_start": 0,
                    "update_retry_s": 1.0,
                },
                "robots": [{"id": rid, "task": "lift", "sim": False} for rid in ROBOTS],
            }
        }
    )
    return build_commands(plan_fleet(config), run_dir)


def _run_fleet(run_dir: Path, ros_env: dict, processes, crash_at=()) -> list[Path]:
    """Robots once; the server once per entry of ``crash_at`` (each killed there) and once more
    to the end. Returns the server logs, one per incarnation."""
    commands = _fleet(run_dir)
    env = fleet_env(base=ros_env)
    server_cmd = next(c for c in commands if c.spec.fqn == "/fleet/server")
    robots = {
        c.spec.fqn: processes.start(c.argv, env, log_path=c.log_path)
        for c in commands
        if c is not server_cmd
    }
    logs = []

    def tail() -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-2500:]}"
            for p in logs + [c.log_path for c in commands if c is not server_cmd]
        )

    for i, (spec, committed) in enumerate([*crash_at, (None, ROUNDS - 1)]):
        logs.append(run_dir / "logs" / f"server_{i}.log")
        server = processes.start(
            server_cmd.argv, dict(env, FED_ROS_CRASH_AT=spec) if spec else env, log_path=logs[-1]
        )
        deadline = time.monotonic() + 300  # liveness only
        while server.poll() is None:
            dead = {fqn: p.returncode for fqn, p in robots.items() if p.poll() is not None}
            assert not dead, f"robot nodes died: {dead}\n{tail()}"
            assert time.monotonic() < deadline, f"server {i} ({spec}) did not end\n{tail()}"
            time.sleep(0.2)
        expected = -signal.SIGKILL if spec else 0
        assert server.returncode == expected, (
            f"server {i} ({spec}) exited {server.returncode}\n{tail()}"
        )
        snap = ModelStore(run_dir / "server").load_latest()
        assert snap is not None and snap.round_idx == committed, (spec, snap and snap.round_idx)
    return logs


def _final(run_dir: Path) -> dict:
    store = ModelStore(run_dir / "server")
    snap = store.load_latest()
    assert store.committed_rounds()[-1] == ROUNDS - 1
    return {
        "models": {
            c: {n: a.tobytes() for n, a in m.items()} for c, m in snap.cluster_models.items()
        },
        "assignments": snap.assignments,
    }


def _robot_log(run_dir: Path, rid: str) -> str:
    return next((run_dir / "logs").glob(f"{rid}*.log")).read_text()


def assert_same_final_models(reference: dict, crashed: dict) -> None:
    """Memberships and every tensor of every cluster model of the last round, bit for bit."""
    assert crashed["assignments"] == reference["assignments"]
    assert sorted(crashed["models"]) == sorted(reference["models"])
    for cid, model in reference["models"].items():
        for name, data in model.items():
            assert crashed["models"][cid][name] == data, (
                f"cluster {cid} tensor {name} differs after the restart"
            )

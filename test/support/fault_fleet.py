"""A simulated fleet with a monitor, and waiting on it while its processes may die."""

from __future__ import annotations

import time
from pathlib import Path
import pytest
from fed_ros.ros.fleet.launcher import build_commands
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.plan import plan_fleet


def _fleet(
    tmp_path: Path,
    robots: int,
    rounds: int,
    algorithm: str = "fedavg",
    channel: str = "auto",
    robot_params: dict[str, dict] | None = None,
    **server,
) -> list:
    from fed_ros.learning.dataset import synthetic_episodes

    config = fleet_config_from_dict(
        {
            "fleet": {
                "name": "faults",
                "algorithm": algorithm,
                "rounds": rounds,
                "run_dir": str(tmp_path),
                "server": dict({"round_timeout_s": 60.0, "transfer_channel": channel}, **server),
                "robot_defaults": {
                    "train_max_steps": 2,
                    "register_timeout_s": 120.0,
                    "trainer.val_fraction": 0.0,
                    "torch_threads": 1,
                    "transfer_channel": channel,
                },
                "robots": [
                    {
                        "id": f"robot_{i}",
                        "task": "lift",
                        "sim": False,
                        "parameters": (robot_params or {}).get(f"robot_{i}", {}),
                    }
                    for i in range(robots)
                ],
            }
        }
    )
    for i in range(robots):
        demos = tmp_path / f"robot_{i}" / "demos"
        demos.mkdir(parents=True)
        for k, episode in enumerate(synthetic_episodes(2, length=20, seed=i)):
            episode.save(demos / f"synthetic_{k}.npz")
    return build_commands(plan_fleet(config), tmp_path)


def _wait(monitor, predicate, timeout: float, procs: dict, what: str, allow_dead=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        monitor.spin_once(0.2)
        dead = {
            f: p.returncode
            for f, p in procs.items()
            if p.poll() is not None and f not in allow_dead
        }
        assert not dead, f"nodes died while waiting for {what}: {dead}"
        if predicate():
            return
    pytest.fail(f"timed out waiting for {what}; reports: {monitor.reports}")

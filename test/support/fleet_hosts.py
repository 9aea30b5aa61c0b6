"""Fleet hosts for tests across network namespaces (fed_ros/ros/rigs/netns.py): the
environment and the `fed-ros up` command line docs/fleet.md's "Across machines" section gives each
machine, and where a host's node logs land. Shared by test_multihost.py and
test_heartbeats_outage.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FED_ROS = str(Path(sys.executable).parent / "fed-ros")


def host_env(address: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in (
        "ROS_AUTOMATIC_DISCOVERY_RANGE",
        "ROS_LOCALHOST_ONLY",
        "FASTDDS_DEFAULT_PROFILES_FILE",
        "FED_ROS_BULK_BIND",
        "ROS_DOMAIN_ID",
    ):
        env.pop(key, None)  # only what the docs tell a machine to set
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    env["FED_ROS_BULK_HOST"] = address  # docs/fleet.md: an address of this machine the others reach
    return env


def up_argv(fleet: Path, host: str, domain: int, run_dir: Path) -> list[str]:
    """docs/fleet.md, "Across machines": the server's and each robot's `fed-ros up`."""
    where = ["--robots", ""] if host == "server" else ["--no-server", "--robots", host]
    return [
        FED_ROS,
        "up",
        str(fleet),
        *where,
        "--discovery-range",
        "SUBNET",
        "--domain-id",
        str(domain),
        "--run-dir",
        str(run_dir),
    ]


def node_log(tmp: Path, host: str) -> Path:
    node = "fleet__server" if host == "server" else f"{host}__robot"
    return tmp / "hosts" / host / "logs" / f"{node}.log"


def tail(path: Path, n: int = 40) -> str:
    try:
        return f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"--- {path}: none"


def stop_hosts(ups: dict[str, subprocess.Popen]) -> None:
    """SIGINT every host's `fed-ros up` (it stops its nodes), then reap; SIGKILL after 20 s."""
    for proc in ups.values():
        if proc.poll() is None:
            proc.send_signal(2)
    for proc in ups.values():
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

"""A fleet config file: the YAML mapping under ``fleet:`` read into a validated ``FleetConfig``.

The fleet's shape (``RobotConfig``, ``FleetConfig``) and the nodes it starts are
:mod:`fed_ros.ros.fleet.plan`; this module is the reading of the file a person writes: the
keys it may hold, robot entries (``task`` or ``tasks``, ``count`` copies, ids given to robots
without one), the type of every value, and where the default file (config/fleet_demo.yaml)
lies. Every mistake is a ValueError naming the key. Pure Python (PyYAML only), like the plan:
launch files import it where rclpy may be missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fed_ros.ros.fleet.discovery import discovery_from_dict
from fed_ros.ros.fleet.plan import PACKAGE, FleetConfig, RobotConfig


_FLEET_KEYS = {
    "name",
    "algorithm",
    "rounds",
    "num_clusters",
    "policy",
    "vision_backbone",
    "backbone_weights",
    "freeze_backbone",
    "architecture",
    "seed",
    "run_dir",
    "server",
    "robot_defaults",
    "bridge",
    "robots",
    "strategy",
    "discovery",
}
_ROBOT_KEYS = {
    "id",
    "task",
    "tasks",
    "variation",
    "sim",
    "parameters",
    "bridge",
    "remappings",
    "count",
    "profile",
    "arm",
}


def _robot_from_dict(entry: Any, index: int) -> list[RobotConfig]:
    if not isinstance(entry, dict):
        raise ValueError(f"fleet robots[{index}] must be a mapping, got {entry!r}")
    unknown = sorted(set(entry) - _ROBOT_KEYS)
    if unknown:
        raise ValueError(
            f"fleet robots[{index}]: unknown key(s) {unknown} (known: {sorted(_ROBOT_KEYS)})"
        )
    if "task" in entry and "tasks" in entry:
        raise ValueError(f"fleet robots[{index}]: give 'task' or 'tasks', not both")
    tasks = entry.get("tasks", [entry["task"]] if "task" in entry else None)
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        raise ValueError(f"fleet robots[{index}]: 'task'/'tasks' must name tasks, got {tasks!r}")
    remaps = entry.get("remappings", {})
    if not isinstance(remaps, dict):
        raise ValueError(f"fleet robots[{index}]: 'remappings' must be a mapping, got {remaps!r}")
    count = entry.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"fleet robots[{index}]: 'count' must be an integer >= 1, got {count!r}")
    if count > 1 and "id" in entry:
        raise ValueError(f"fleet robots[{index}]: 'id' cannot be combined with 'count' > 1")
    if not isinstance(entry.get("profile", ""), str):
        raise ValueError(
            f"fleet robots[{index}]: 'profile' must name an arm profile, got {entry['profile']!r}"
        )
    for key in ("parameters", "bridge", "arm"):
        if not isinstance(entry.get(key, {}), dict):
            raise ValueError(f"fleet robots[{index}]: {key!r} must be a mapping")
    # Robots without an id get "robot_<position in fleet>" in fleet_config_from_dict.
    return [
        RobotConfig(
            robot_id=str(entry.get("id", _UNNAMED)),
            tasks=tuple(tasks),
            variation=str(entry.get("variation", "default")),
            sim=bool(entry.get("sim", True)),
            parameters=dict(entry.get("parameters", {})),
            bridge_parameters=dict(entry.get("bridge", {})),
            remappings=tuple((str(a), str(b)) for a, b in remaps.items()),
            profile=entry.get("profile", ""),
            arm=dict(entry.get("arm", {})),
        )
        for _ in range(count)
    ]


_UNNAMED = "unnamed"


def fleet_config_from_dict(data: Any) -> FleetConfig:
    """Build and validate a FleetConfig from a parsed YAML mapping (top key ``fleet``)."""
    if isinstance(data, dict) and set(data) == {"fleet"}:
        data = data["fleet"]
    if not isinstance(data, dict):
        raise ValueError(
            f"fleet config must be a mapping under 'fleet:', got {type(data).__name__}"
        )
    unknown = sorted(set(data) - _FLEET_KEYS)
    if unknown:
        raise ValueError(f"fleet config: unknown key(s) {unknown} (known: {sorted(_FLEET_KEYS)})")
    for key in ("name", "algorithm", "rounds", "robots"):
        if key not in data:
            raise ValueError(f"fleet config: missing required key {key!r}")
    raw_robots = data["robots"]
    if not isinstance(raw_robots, list) or not raw_robots:
        raise ValueError(f"fleet config: 'robots' must be a non-empty list, got {raw_robots!r}")
    robots: list[RobotConfig] = []
    for i, entry in enumerate(raw_robots):
        robots.extend(_robot_from_dict(entry, i))
    robots = [
        RobotConfig(
            robot_id=f"robot_{i}",
            tasks=r.tasks,
            variation=r.variation,
            sim=r.sim,
            parameters=r.parameters,
            bridge_parameters=r.bridge_parameters,
            remappings=r.remappings,
            profile=r.profile,
            arm=r.arm,
        )
        if r.robot_id == _UNNAMED
        else r
        for i, r in enumerate(robots)
    ]
    for key in ("server", "robot_defaults", "bridge", "strategy", "architecture"):
        if not isinstance(data.get(key, {}), dict):
            raise ValueError(f"fleet config: {key!r} must be a mapping, got {data.get(key)!r}")
    for key in ("vision_backbone", "backbone_weights"):
        if not isinstance(data.get(key, ""), str):
            raise ValueError(f"fleet config: {key!r} must be a string, got {data[key]!r}")
    freeze = data.get("freeze_backbone", True)
    if not isinstance(freeze, bool):
        raise ValueError(f"fleet config: 'freeze_backbone' must be true or false, got {freeze!r}")
    for key in ("rounds", "num_clusters", "seed"):
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"fleet config: {key!r} must be an integer, got {value!r}")
    return FleetConfig(
        name=str(data["name"]),
        algorithm=str(data["algorithm"]),
        rounds=data["rounds"],
        robots=tuple(robots),
        num_clusters=data.get("num_clusters", 2),
        policy=str(data.get("policy", "lowdim")),
        vision_backbone=data.get("vision_backbone", "scratch"),
        backbone_weights=data.get("backbone_weights", ""),
        freeze_backbone=data.get("freeze_backbone", True),
        architecture=dict(data.get("architecture", {})),
        seed=data.get("seed", 0),
        run_dir=str(data.get("run_dir", f"runs/{data['name']}")),
        server=dict(data.get("server", {})),
        robot_defaults=dict(data.get("robot_defaults", {})),
        bridge=dict(data.get("bridge", {})),
        strategy=dict(data.get("strategy", {})),
        discovery=discovery_from_dict(data.get("discovery")),
    )


def load_fleet_config(path: str | Path) -> FleetConfig:
    """Read a fleet YAML file (``yaml.safe_load``) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"fleet config file not found: {str(path)!r}")
    with open(path, encoding="utf-8") as f:
        return fleet_config_from_dict(yaml.safe_load(f))


DEMO_FLEET_FILE = "fleet_demo.yaml"
# The demo fleet learning from cameras: more demonstrations and steps than the low-dim demo
# (`fed-ros demo --policy image` starts it when no --fleet is given).
IMAGE_DEMO_FLEET_FILE = "fleet_demo_image.yaml"


def default_fleet_file(launch_dir: str = "", name: str = DEMO_FLEET_FILE) -> str:
    """config/<name> (the demo fleet by default): from the installed share directory, else the
    source tree."""
    candidates = []
    try:  # a colcon install: share/fed_ros/config
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory(PACKAGE)) / "config" / name)
    except Exception:  # noqa: BLE001 - ament_index missing or package not installed
        pass
    if launch_dir:
        candidates.append(Path(launch_dir).resolve().parent / "config" / name)
    candidates.append(Path(__file__).resolve().parents[3] / "config" / name)
    for path in candidates:
        if path.is_file():
            return str(path)
    return str(candidates[-1])

"""One fleet plan: which nodes a fleet config starts, with names, namespaces and parameters.

Both the ROS 2 launch files (``launch/*.launch.py``) and ``fed-ros up`` start exactly the
list :func:`plan_fleet` returns, so the two can never disagree. This module is pure
Python (PyYAML only, no rclpy, no launch): launch files import it on machines where the
rest of fed_ros may not even be importable, and the nodes import their parameter
defaults and validators from here so there is one source of truth for them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

PACKAGE = "fed_ros"

# Mirrors fed_ros.core.strategy.make_strategy names and fed_ros.sim.envs.TASKS; kept as
# literals so a launch file can validate a config without importing numpy/torch/MuJoCo
# (test_fleet_plan checks they stay in sync).
ALGORITHMS = ("local", "fedavg", "fedprox", "ifca", "feddrman", "fedepth", "rnd")
SIM_TASKS = ("lift", "pick_place_can", "stack")
POLICY_KINDS = ("lowdim", "image")
TRANSFER_CHANNELS = ("auto", "ros", "zmq")

# Executables installed under lib/fed_ros (ros2 run fed_ros <exe>) and the Python entry
# point `fed-ros up` runs for each of them.
EXECUTABLE_ENTRY_POINTS: dict[str, str] = {
    "server_node": "fed_ros.ros.nodes.server_node:main",
    "robot_node": "fed_ros.ros.nodes.robot_node:main",
    "sim_bridge_node": "fed_ros.ros.nodes.sim_bridge_node:main",
    "expert_driver_node": "fed_ros.ros.nodes.expert_driver_node:main",
    "arm_adapter_node": "fed_ros.ros.nodes.arm_adapter_node:main",
}

SERVER_NAMESPACE = "/fleet"
SERVER_NODE_NAME = "server"
ROBOT_NODE_NAME = "robot"
BRIDGE_NODE_NAME = "arm"
ADAPTER_NODE_NAME = "arm_adapter"

_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")

# ---------------------------------------------------------------------------------------
# Node parameters: defaults (the type of each default is the parameter's type) and checks.
# Nodes declare exactly these; config/server.yaml and config/robot.yaml document them.
# ---------------------------------------------------------------------------------------

SERVER_DEFAULTS: dict[str, Any] = {
    "algorithm": "feddrman",          # strategy name (ALGORITHMS)
    "rounds": 3,                      # rounds to complete, then STAGE_DONE
    "num_clusters": 2,                # C for FedDRMan / IFCA (ignored by the others)
    "expected_robots": [""],          # robot ids that must register before round 0 ([""] = none)
    "min_robots": 1,                  # start round 0 once this many robots registered
    "registration_timeout_s": 120.0,  # s; after this, start with >= min_robots registered
    "quorum_fraction": 0.75,          # fraction of participants whose update completes a round
    "min_quorum": 1,                  # lower bound on the quorum (updates)
    "round_timeout_s": 600.0,         # s; deadline = announcement time + this
    "max_attempts": 3,                # announcements of one round before the server gives up
    "state_dir": "runs/server",       # ModelStore directory (committed rounds)
    "policy": "lowdim",               # initial policy kind when no model is committed yet
    "seed": 0,                        # seed of the initial policy weights
    "evaluate_every": 0,              # rounds between closed-loop evaluations (0 = never)
    "eval_episodes": 2,               # episodes per task per robot evaluation
    "eval_timeout_s": 600.0,          # s to wait for robots' evaluation results
    "max_update_bytes": 256 << 20,    # bytes; larger updates are rejected before assembly
    "max_samples": 1_000_000,         # cap on self-reported sample counts
    "transfer_channel": "auto",       # model bytes over ROS messages or the zmq bulk channel
    "bulk_threshold_bytes": 1 << 20,  # bytes; with transfer_channel auto, payloads this large go over zmq
    "exit_when_done": False,          # exit 0 after the last round instead of staying up
    "require_signatures": False,      # reject unsigned updates (Ed25519, fed-ros keys)
    "allowed_keys_file": "",          # allow-list of robot public keys (YAML), "" = any
    "private_key_file": "",           # server Ed25519 key: signs cluster models, "" = unsigned
}

ROBOT_DEFAULTS: dict[str, Any] = {
    "robot_id": "",                   # "" = the node namespace without the leading '/'
    "tasks": ["lift"],                # tasks this robot records and is evaluated on
    "variation": "default",           # environment variation preset (sim) / site tag (real)
    "fleet_namespace": SERVER_NAMESPACE,  # where the server's topics and services live
    "arm_namespace": "",              # "" = <robot ns>/arm/...; "/P" = /P/arm/... (a real driver)
    "data_dir": "",                   # demonstrations (demos/: recordings, *.npz episodes), models ("" = runs/robots/<robot_id>)
    "collect_demos_on_start": 0,      # episodes to record with the scripted expert over ROS
    "demo_seed": 0,                   # seed of the first bootstrap episode
    "demo_noise_std": 0.0,            # expert action noise for demonstration diversity
    "max_episode_steps": 400,         # steps; safety cap for expert / policy episodes
    "policy": "lowdim",               # policy kind (must match the server's model)
    "device": "auto",                 # torch device for training: auto | cpu | cuda
    "torch_threads": 0,               # CPU threads for torch (0 = torch's default: all cores)
    "seed": 0,                        # training seed (offset by round)
    "train_batch_size": 32,           # frames per batch
    "train_lr": 1e-4,                 # AdamW learning rate
    "train_max_steps": 0,             # cap on optimiser steps per round (0 = full epochs)
    "eval_episodes": 2,               # default episodes per task for EvaluatePolicy
    "register_timeout_s": 60.0,       # s to keep retrying registration before giving up
    "transfer_channel": "auto",       # model bytes over ROS messages or the zmq bulk channel
    "bulk_threshold_bytes": 1 << 20,  # bytes; with transfer_channel auto, payloads this large go over zmq
    "update_retry_s": 2.0,            # s before an unacknowledged update is re-sent (doubling, max 10 s)
    "private_key_file": "",           # Ed25519 key (fed-ros keys) to sign updates, "" = unsigned
    "allowed_keys_file": "",          # allow-list YAML whose `server:` key signs cluster models
}


def _check_type(node: str, name: str, value: Any, default: Any) -> Any:
    """Coerce ``value`` to the type of ``default`` or raise ValueError naming the parameter."""
    where = f"{node} parameter {name!r}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be a bool, got {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{where} must be finite, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError(f"{where} must be a string, got {value!r}")
        return value
    if isinstance(default, list):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where} must be a list of strings, got {value!r}")
        return list(value)
    raise TypeError(f"unsupported parameter type for {name!r}")  # programming error


def _merge(node: str, defaults: Mapping[str, Any], params: Mapping[str, Any],
           open_prefixes: Sequence[str]) -> dict[str, Any]:
    """Defaults overlaid with ``params``; unknown names raise ValueError naming them."""
    merged = dict(defaults)
    for name, value in params.items():
        if name in defaults:
            merged[name] = _check_type(node, name, value, defaults[name])
        elif any(name.startswith(p + ".") for p in open_prefixes):
            merged[name] = value  # validated by whoever consumes the group (e.g. make_strategy)
        else:
            raise ValueError(f"unknown {node} parameter {name!r} "
                             f"(known: {', '.join(sorted(defaults))})")
    return merged


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def validate_server_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Full, checked server parameter set (``strategy.*`` passes through to the strategy)."""
    p = _merge("server", SERVER_DEFAULTS, params, open_prefixes=("strategy",))
    _require(p["algorithm"] in ALGORITHMS,
             f"server parameter 'algorithm' must be one of {ALGORITHMS}, got {p['algorithm']!r}")
    _require(p["rounds"] >= 1, f"server parameter 'rounds' must be >= 1, got {p['rounds']}")
    _require(p["num_clusters"] >= 1,
             f"server parameter 'num_clusters' must be >= 1, got {p['num_clusters']}")
    _require(p["min_robots"] >= 1, f"server parameter 'min_robots' must be >= 1, got {p['min_robots']}")
    _require(0.0 < p["quorum_fraction"] <= 1.0,
             f"server parameter 'quorum_fraction' must be in (0, 1], got {p['quorum_fraction']}")
    _require(p["min_quorum"] >= 1, f"server parameter 'min_quorum' must be >= 1, got {p['min_quorum']}")
    for name in ("round_timeout_s", "registration_timeout_s", "eval_timeout_s"):
        _require(p[name] > 0.0, f"server parameter {name!r} must be > 0 s, got {p[name]}")
    _require(p["max_attempts"] >= 1,
             f"server parameter 'max_attempts' must be >= 1, got {p['max_attempts']}")
    _require(p["state_dir"] != "", "server parameter 'state_dir' must not be empty")
    _require(p["policy"] in POLICY_KINDS,
             f"server parameter 'policy' must be one of {POLICY_KINDS}, got {p['policy']!r}")
    _require(p["evaluate_every"] >= 0,
             f"server parameter 'evaluate_every' must be >= 0, got {p['evaluate_every']}")
    _require(p["eval_episodes"] >= 1,
             f"server parameter 'eval_episodes' must be >= 1, got {p['eval_episodes']}")
    _require(p["max_update_bytes"] >= 1024,
             f"server parameter 'max_update_bytes' must be >= 1024, got {p['max_update_bytes']}")
    _require(p["max_samples"] >= 1, f"server parameter 'max_samples' must be >= 1, got {p['max_samples']}")
    _require(p["transfer_channel"] in TRANSFER_CHANNELS,
             f"server parameter 'transfer_channel' must be one of {TRANSFER_CHANNELS}, "
             f"got {p['transfer_channel']!r}")
    _require(p["bulk_threshold_bytes"] >= 0,
             f"server parameter 'bulk_threshold_bytes' must be >= 0, got {p['bulk_threshold_bytes']}")
    p["expected_robots"] = [r for r in p["expected_robots"] if r]
    for rid in p["expected_robots"]:
        _require(bool(_ID_RE.match(rid)), f"server parameter 'expected_robots' has a bad id {rid!r}")
    return p


def validate_robot_params(params: Mapping[str, Any], namespace: str = "") -> dict[str, Any]:
    """Full, checked robot parameter set (``trainer.*`` passes through to TrainerConfig)."""
    p = _merge("robot", ROBOT_DEFAULTS, params, open_prefixes=("trainer",))
    if not p["robot_id"]:
        p["robot_id"] = namespace.strip("/").replace("/", "_")
    _require(bool(_ID_RE.match(p["robot_id"])),
             f"robot parameter 'robot_id' must match {_ID_RE.pattern}, got {p['robot_id']!r}")
    _require(len(p["tasks"]) >= 1 and all(p["tasks"]),
             f"robot parameter 'tasks' must name at least one task, got {p['tasks']!r}")
    _require(p["collect_demos_on_start"] >= 0,
             f"robot parameter 'collect_demos_on_start' must be >= 0, got {p['collect_demos_on_start']}")
    _require(p["demo_noise_std"] >= 0.0,
             f"robot parameter 'demo_noise_std' must be >= 0, got {p['demo_noise_std']}")
    _require(p["max_episode_steps"] >= 1,
             f"robot parameter 'max_episode_steps' must be >= 1, got {p['max_episode_steps']}")
    _require(p["policy"] in POLICY_KINDS,
             f"robot parameter 'policy' must be one of {POLICY_KINDS}, got {p['policy']!r}")
    _require(p["device"] in ("auto", "cpu", "cuda") or p["device"].startswith("cuda:"),
             f"robot parameter 'device' must be auto, cpu or cuda[:N], got {p['device']!r}")
    _require(p["torch_threads"] >= 0,
             f"robot parameter 'torch_threads' must be >= 0, got {p['torch_threads']}")
    _require(p["train_batch_size"] >= 1,
             f"robot parameter 'train_batch_size' must be >= 1, got {p['train_batch_size']}")
    _require(p["train_lr"] > 0.0, f"robot parameter 'train_lr' must be > 0, got {p['train_lr']}")
    _require(p["train_max_steps"] >= 0,
             f"robot parameter 'train_max_steps' must be >= 0, got {p['train_max_steps']}")
    _require(p["eval_episodes"] >= 1,
             f"robot parameter 'eval_episodes' must be >= 1, got {p['eval_episodes']}")
    _require(p["register_timeout_s"] > 0.0,
             f"robot parameter 'register_timeout_s' must be > 0, got {p['register_timeout_s']}")
    _require(p["transfer_channel"] in TRANSFER_CHANNELS,
             f"robot parameter 'transfer_channel' must be one of {TRANSFER_CHANNELS}, "
             f"got {p['transfer_channel']!r}")
    _require(p["bulk_threshold_bytes"] >= 0,
             f"robot parameter 'bulk_threshold_bytes' must be >= 0, got {p['bulk_threshold_bytes']}")
    _require(p["update_retry_s"] > 0.0,
             f"robot parameter 'update_retry_s' must be > 0, got {p['update_retry_s']}")
    _require(p["arm_namespace"] == "" or p["arm_namespace"].startswith("/"),
             f"robot parameter 'arm_namespace' must be empty or absolute, got {p['arm_namespace']!r}")
    _require(p["fleet_namespace"].startswith("/"),
             f"robot parameter 'fleet_namespace' must be absolute, got {p['fleet_namespace']!r}")
    if not p["data_dir"]:
        p["data_dir"] = f"runs/robots/{p['robot_id']}"
    return p


# ---------------------------------------------------------------------------------------
# Fleet config
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RobotConfig:
    """One robot of the fleet: its id, tasks, variation and whether a sim bridge drives it."""

    robot_id: str
    tasks: tuple[str, ...]
    variation: str = "default"
    sim: bool = True
    parameters: Mapping[str, Any] = field(default_factory=dict)
    bridge_parameters: Mapping[str, Any] = field(default_factory=dict)
    remappings: tuple[tuple[str, str], ...] = ()
    # Arm profile (config/arm_profiles/<profile>.yaml or a path): an arm adapter speaks the
    # arm's standard interfaces; ``arm`` overrides any profile field (nested mapping).
    profile: str = ""
    arm: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _ID_RE.match(self.robot_id):
            raise ValueError(f"robot id must match {_ID_RE.pattern}, got {self.robot_id!r}")
        if self.arm and not self.profile:
            raise ValueError(f"robot {self.robot_id!r}: 'arm' overrides need a 'profile'")
        if self.profile:
            from fed_ros.core.arm_profile import load_profile
            try:
                profile = load_profile(self.profile, self.arm)
            except ValueError as exc:
                raise ValueError(f"robot {self.robot_id!r}: {exc}") from None
            sim_joints = tuple(f"robot0_joint{i}" for i in range(1, 8))
            if self.sim and profile.joints.names != sim_joints:
                raise ValueError(f"robot {self.robot_id!r}: the simulator is a Panda with joints "
                                 f"{list(sim_joints)}; profile {self.profile!r} has "
                                 f"{list(profile.joints.names)} (use panda_sim, or sim: false)")
        if not self.tasks:
            raise ValueError(f"robot {self.robot_id!r} has no tasks")
        if self.sim:
            for task in self.tasks:
                if task not in SIM_TASKS:
                    raise ValueError(f"robot {self.robot_id!r}: unknown sim task {task!r} "
                                     f"(known: {', '.join(SIM_TASKS)})")


@dataclass(frozen=True)
class FleetConfig:
    """A validated fleet: server settings, robots and per-node parameter overrides."""

    name: str
    algorithm: str
    rounds: int
    robots: tuple[RobotConfig, ...]
    num_clusters: int = 2
    policy: str = "lowdim"
    seed: int = 0
    run_dir: str = "runs/fleet"
    server: Mapping[str, Any] = field(default_factory=dict)
    robot_defaults: Mapping[str, Any] = field(default_factory=dict)
    bridge: Mapping[str, Any] = field(default_factory=dict)
    # Strategy settings (server parameters strategy.<key>), e.g. mu, local_steps, lr: the
    # training settings among them reach every robot in its round config.
    strategy: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _ID_RE.match(self.name):
            raise ValueError(f"fleet name must match {_ID_RE.pattern}, got {self.name!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"fleet algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if self.rounds < 1:
            raise ValueError(f"fleet rounds must be >= 1, got {self.rounds}")
        if self.num_clusters < 1:
            raise ValueError(f"fleet num_clusters must be >= 1, got {self.num_clusters}")
        if self.policy not in POLICY_KINDS:
            raise ValueError(f"fleet policy must be one of {POLICY_KINDS}, got {self.policy!r}")
        if not self.robots:
            raise ValueError("fleet has no robots")
        ids = [r.robot_id for r in self.robots]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate robot ids in fleet: {dupes}")
        # Fail at load time, not when a node starts: run the same checks the nodes run.
        for node in plan_fleet(self):
            if node.executable == "server_node":
                validate_server_params(node.parameters)
            elif node.executable == "robot_node":
                validate_robot_params(node.parameters, node.namespace)

    @property
    def robot_ids(self) -> list[str]:
        """Robot ids in config order."""
        return [r.robot_id for r in self.robots]


_FLEET_KEYS = {"name", "algorithm", "rounds", "num_clusters", "policy", "seed", "run_dir",
               "server", "robot_defaults", "bridge", "robots", "strategy"}
_ROBOT_KEYS = {"id", "task", "tasks", "variation", "sim", "parameters", "bridge", "remappings",
               "count", "profile", "arm"}


def _robot_from_dict(entry: Any, index: int) -> list[RobotConfig]:
    if not isinstance(entry, dict):
        raise ValueError(f"fleet robots[{index}] must be a mapping, got {entry!r}")
    unknown = sorted(set(entry) - _ROBOT_KEYS)
    if unknown:
        raise ValueError(f"fleet robots[{index}]: unknown key(s) {unknown} "
                         f"(known: {sorted(_ROBOT_KEYS)})")
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
        raise ValueError(f"fleet robots[{index}]: 'profile' must name an arm profile, got {entry['profile']!r}")
    for key in ("parameters", "bridge", "arm"):
        if not isinstance(entry.get(key, {}), dict):
            raise ValueError(f"fleet robots[{index}]: {key!r} must be a mapping")
    # Robots without an id get "robot_<position in fleet>" in fleet_config_from_dict.
    return [RobotConfig(robot_id=str(entry.get("id", _UNNAMED)), tasks=tuple(tasks),
                        variation=str(entry.get("variation", "default")),
                        sim=bool(entry.get("sim", True)),
                        parameters=dict(entry.get("parameters", {})),
                        bridge_parameters=dict(entry.get("bridge", {})),
                        remappings=tuple((str(a), str(b)) for a, b in remaps.items()),
                        profile=entry.get("profile", ""), arm=dict(entry.get("arm", {})))
            for _ in range(count)]


_UNNAMED = "unnamed"


def fleet_config_from_dict(data: Any) -> FleetConfig:
    """Build and validate a FleetConfig from a parsed YAML mapping (top key ``fleet``)."""
    if isinstance(data, dict) and set(data) == {"fleet"}:
        data = data["fleet"]
    if not isinstance(data, dict):
        raise ValueError(f"fleet config must be a mapping under 'fleet:', got {type(data).__name__}")
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
    robots = [RobotConfig(robot_id=f"robot_{i}", tasks=r.tasks, variation=r.variation, sim=r.sim,
                          parameters=r.parameters, bridge_parameters=r.bridge_parameters,
                          remappings=r.remappings, profile=r.profile,
                          arm=r.arm) if r.robot_id == _UNNAMED else r
              for i, r in enumerate(robots)]
    for key in ("server", "robot_defaults", "bridge", "strategy"):
        if not isinstance(data.get(key, {}), dict):
            raise ValueError(f"fleet config: {key!r} must be a mapping, got {data.get(key)!r}")
    for key in ("rounds", "num_clusters", "seed"):
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"fleet config: {key!r} must be an integer, got {value!r}")
    return FleetConfig(
        name=str(data["name"]), algorithm=str(data["algorithm"]), rounds=data["rounds"],
        robots=tuple(robots), num_clusters=data.get("num_clusters", 2),
        policy=str(data.get("policy", "lowdim")), seed=data.get("seed", 0),
        run_dir=str(data.get("run_dir", f"runs/{data['name']}")),
        server=dict(data.get("server", {})), robot_defaults=dict(data.get("robot_defaults", {})),
        bridge=dict(data.get("bridge", {})), strategy=dict(data.get("strategy", {})))


def load_fleet_config(path: str | Path) -> FleetConfig:
    """Read a fleet YAML file (``yaml.safe_load``) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"fleet config file not found: {str(path)!r}")
    with open(path, encoding="utf-8") as f:
        return fleet_config_from_dict(yaml.safe_load(f))


# ---------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeSpec:
    """One node to start: what launch_ros.actions.Node and `fed-ros up` both take."""

    package: str
    executable: str
    name: str
    namespace: str
    parameters: Mapping[str, Any]
    remappings: tuple[tuple[str, str], ...] = ()

    @property
    def fqn(self) -> str:
        """Fully qualified node name, e.g. ``/robot_0/robot``."""
        return f"{self.namespace.rstrip('/')}/{self.name}"

    def params_yaml(self) -> dict[str, Any]:
        """The node's parameters as a ROS 2 params file mapping (``fqn: ros__parameters:``)."""
        return {self.fqn: {"ros__parameters": dict(self.parameters)}}


def server_spec(config: FleetConfig) -> NodeSpec:
    """The fleet server node."""
    params: dict[str, Any] = {
        "algorithm": config.algorithm, "rounds": config.rounds,
        "num_clusters": config.num_clusters, "policy": config.policy, "seed": config.seed,
        "expected_robots": config.robot_ids, "state_dir": f"{config.run_dir}/server",
    }
    params.update({f"strategy.{k}": v for k, v in config.strategy.items()})
    params.update(config.server)
    if "min_robots" not in params:
        # All robots start round 0 together; if some never register, the fleet starts after
        # registration_timeout_s with a quorum of them instead of waiting forever.
        fraction = params.get("quorum_fraction", SERVER_DEFAULTS["quorum_fraction"])
        if isinstance(fraction, (int, float)) and 0 < fraction <= 1:
            params["min_robots"] = max(1, math.ceil(fraction * len(config.robots) - 1e-9))
    return NodeSpec(PACKAGE, "server_node", SERVER_NODE_NAME, SERVER_NAMESPACE, params)


def robot_spec(config: FleetConfig, robot: RobotConfig, index: int) -> NodeSpec:
    """The onboard robot node of one robot."""
    params: dict[str, Any] = {
        "robot_id": robot.robot_id, "tasks": list(robot.tasks), "variation": robot.variation,
        "policy": config.policy, "seed": config.seed + index,
        "demo_seed": 1000 * (config.seed + index),
        "data_dir": f"{config.run_dir}/{robot.robot_id}",
    }
    if robot.sim:
        # Simulated arms share one machine: one torch thread each (oversubscribed CPU
        # threads made local training ~30x slower when measured on 2 cores).
        params["torch_threads"] = 1
    params.update(config.robot_defaults)
    params.update(robot.parameters)
    return NodeSpec(PACKAGE, "robot_node", ROBOT_NODE_NAME, f"/{robot.robot_id}", params,
                    robot.remappings)


def bridge_spec(config: FleetConfig, robot: RobotConfig, index: int) -> NodeSpec:
    """The MuJoCo bridge standing in for the robot's arm driver (sim robots only)."""
    params: dict[str, Any] = {
        "task": robot.tasks[0], "variation": robot.variation,
        "cameras": config.policy == "image", "seed": config.seed + index,
    }
    if robot.profile:  # the simulated arm offers only standard interfaces, for the adapter
        params.update(interface="ros2_control", profile=robot.profile,
                      profile_overrides=_overrides_text(robot.arm))
    params.update(config.bridge)
    params.update(robot.bridge_parameters)
    return NodeSpec(PACKAGE, "sim_bridge_node", BRIDGE_NODE_NAME, f"/{robot.robot_id}", params)


def _overrides_text(arm: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(arm), default_flow_style=True).strip() if arm else ""


def adapter_spec(config: FleetConfig, robot: RobotConfig) -> NodeSpec:
    """The arm adapter: the robot node's arm topics on the arm's standard interfaces."""
    params: dict[str, Any] = {
        "profile": robot.profile, "profile_overrides": _overrides_text(robot.arm),
        "task": robot.tasks[0], "cameras": config.policy == "image",
        "max_episode_steps": int(robot.parameters.get(
            "max_episode_steps", config.robot_defaults.get("max_episode_steps",
                                                           ROBOT_DEFAULTS["max_episode_steps"]))),
    }
    return NodeSpec(PACKAGE, "arm_adapter_node", ADAPTER_NODE_NAME, f"/{robot.robot_id}", params)


def plan_fleet(config: FleetConfig, *, include_server: bool = True,
               robot_ids: Sequence[str] | None = None) -> list[NodeSpec]:
    """Nodes a fleet config starts: the server, then per robot its bridge (sim) and robot node.

    ``robot_ids`` restricts the plan to some robots (e.g. one machine per robot).
    """
    known = set(config.robot_ids)
    if robot_ids is not None:
        bad = sorted(set(robot_ids) - known)
        if bad:
            raise ValueError(f"unknown robot id(s) {bad} (fleet has {config.robot_ids})")
    nodes = [server_spec(config)] if include_server else []
    for index, robot in enumerate(config.robots):
        if robot_ids is not None and robot.robot_id not in robot_ids:
            continue
        if robot.sim:
            nodes.append(bridge_spec(config, robot, index))
        if robot.profile:
            nodes.append(adapter_spec(config, robot))
        nodes.append(robot_spec(config, robot, index))
    return nodes


def format_plan(nodes: Sequence[NodeSpec]) -> str:
    """Human-readable table of a plan (what `fed-ros plan` prints)."""
    lines = [f"{'node':<22} {'executable':<18} parameters"]
    for n in nodes:
        params = ", ".join(f"{k}={v!r}" for k, v in sorted(n.parameters.items()))
        lines.append(f"{n.fqn:<22} {n.executable:<18} {params}")
        for src, dst in n.remappings:
            lines.append(f"{'':<22} {'':<18} remap {src} -> {dst}")
    return "\n".join(lines)


def default_fleet_file(launch_dir: str = "") -> str:
    """config/fleet_demo.yaml: from the installed share directory, else the source tree."""
    candidates = []
    try:  # a colcon install: share/fed_ros/config
        from ament_index_python.packages import get_package_share_directory
        candidates.append(Path(get_package_share_directory(PACKAGE)) / "config" / "fleet_demo.yaml")
    except Exception:  # noqa: BLE001 - ament_index missing or package not installed
        pass
    if launch_dir:
        candidates.append(Path(launch_dir).resolve().parent / "config" / "fleet_demo.yaml")
    candidates.append(Path(__file__).resolve().parents[3] / "config" / "fleet_demo.yaml")
    for path in candidates:
        if path.is_file():
            return str(path)
    return str(candidates[-1])


def launch_description(plan_nodes: Callable[..., list[NodeSpec]],
                       arguments: Sequence[tuple[str, str, str]]):
    """A ROS 2 LaunchDescription that starts ``plan_nodes(*argument values)``.

    ``arguments`` are (name, default, description) of the launch arguments, passed to
    ``plan_nodes`` in order. The launch files call this so the NodeSpec -> launch_ros Node
    conversion exists once; launch / launch_ros are imported here, only when launching.
    """
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    def nodes(context):
        specs = plan_nodes(*(LaunchConfiguration(name).perform(context) for name, _, _ in arguments))
        return [Node(package=s.package, executable=s.executable, name=s.name, namespace=s.namespace,
                     parameters=[dict(s.parameters)], remappings=list(s.remappings), output="screen")
                for s in specs]

    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in arguments]
    return LaunchDescription([*declared, OpaqueFunction(function=nodes)])

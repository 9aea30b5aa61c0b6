"""One fleet plan: which nodes a fleet config starts, with names, namespaces and parameters.

Both the ROS 2 launch files (``launch/*.launch.py``) and ``fed-ros up`` start exactly the
list :func:`plan_fleet` returns, so the two can never disagree. This module is pure
Python (PyYAML only, no rclpy, no launch): launch files import it on machines where the
rest of fed_ros may not even be importable. Node parameters are typed there by the same
dataclasses the nodes declare (fed_ros.ros.configuration.fleet_params and arm_params), the one
source of their defaults and checks. A fleet YAML file becomes a ``FleetConfig`` in
:mod:`fed_ros.ros.fleet.fleet_file`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import yaml

from fed_ros.ros.configuration.arm_params import AdapterParams, BridgeParams
from fed_ros.ros.fleet.discovery import SERVER_EXECUTABLE, DiscoveryConfig
from fed_ros.ros.configuration.fleet_params import (
    ALGORITHMS,
    ID_RE,
    MAX_EPISODE_STEPS,
    POLICY_KINDS,
    SERVER_NAMESPACE,
    SIM_TASKS,
    RobotParams,
    ServerParams,
)
from fed_ros.ros.configuration.param_spec import NodeParams

PACKAGE = "fed_ros"

# Executables installed under lib/fed_ros (ros2 run fed_ros <exe>) and the Python entry
# point `fed-ros up` runs for each of them.
EXECUTABLE_ENTRY_POINTS: dict[str, str] = {
    "server_node": "fed_ros.ros.nodes.server.server_node:main",
    "robot_node": "fed_ros.ros.nodes.robot.robot_node:main",
    "sim_bridge_node": "fed_ros.ros.nodes.sim_bridge.sim_bridge_node:main",
    "expert_driver_node": "fed_ros.ros.nodes.expert_driver.expert_driver_node:main",
    "arm_adapter_node": "fed_ros.ros.nodes.arm_adapter.arm_adapter_node:main",
    "teleop_node": "fed_ros.ros.nodes.teleop.teleop_node:main",
}

SERVER_NODE_NAME = "server"
ROBOT_NODE_NAME = "robot"
BRIDGE_NODE_NAME = "arm"
ADAPTER_NODE_NAME = "arm_adapter"

# The typed parameters of each executable the plan starts (what the node itself declares).
NODE_PARAMS: dict[str, type[NodeParams]] = {
    "server_node": ServerParams,
    "robot_node": RobotParams,
    "sim_bridge_node": BridgeParams,
    "arm_adapter_node": AdapterParams,
}

_ID_RE = ID_RE

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
            from fed_ros.core.arm.profile import load_profile

            try:
                profile = load_profile(self.profile, self.arm)
            except ValueError as exc:
                raise ValueError(f"robot {self.robot_id!r}: {exc}") from None
            sim_joints = tuple(f"robot0_joint{i}" for i in range(1, 8))
            if self.sim and profile.joints.names != sim_joints:
                raise ValueError(
                    f"robot {self.robot_id!r}: the simulator is a Panda with joints "
                    f"{list(sim_joints)}; profile {self.profile!r} has "
                    f"{list(profile.joints.names)} (use panda_sim, or sim: false)"
                )
        if not self.tasks:
            raise ValueError(f"robot {self.robot_id!r} has no tasks")
        if self.sim:
            for task in self.tasks:
                if task not in SIM_TASKS:
                    raise ValueError(
                        f"robot {self.robot_id!r}: unknown sim task {task!r} "
                        f"(known: {', '.join(SIM_TASKS)})"
                    )


@dataclass(frozen=True)
class FleetConfig:
    """A validated fleet: server settings, robots and per-node parameter overrides."""

    name: str
    algorithm: str
    rounds: int
    robots: tuple[RobotConfig, ...]
    num_clusters: int = 2
    policy: str = "lowdim"
    # The image policy's camera trunk, the same on the server and every robot (one architecture).
    vision_backbone: str = "scratch"
    backbone_weights: str = ""
    freeze_backbone: bool = True
    # Further PolicyConfig fields (its size: conv_channels, embed_dim, window, ...), the same
    # on the server and every robot: node parameters architecture.<field>.
    architecture: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    run_dir: str = "runs/fleet"
    server: Mapping[str, Any] = field(default_factory=dict)
    robot_defaults: Mapping[str, Any] = field(default_factory=dict)
    bridge: Mapping[str, Any] = field(default_factory=dict)
    # Strategy settings (server parameters strategy.<key>), e.g. mu, local_steps, lr: the
    # training settings among them reach every robot in its round config.
    strategy: Mapping[str, Any] = field(default_factory=dict)
    # Simple (multicast) discovery, or a Fast DDS Discovery Server every node is pointed at.
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)

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
            NODE_PARAMS[node.executable].from_mapping(node.parameters, namespace=node.namespace)

    @property
    def robot_ids(self) -> list[str]:
        """Robot ids in config order."""
        return [r.robot_id for r in self.robots]


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


def architecture_parameters(config: FleetConfig) -> dict[str, Any]:
    """The policy's architecture as node parameters, the same for the server and every robot:
    the camera trunk (none for the default scratch trunk) and ``architecture.<field>``."""
    arch = {f"architecture.{k}": v for k, v in config.architecture.items()}
    if config.vision_backbone == "scratch" and not config.backbone_weights:
        return arch
    return {
        **arch,
        "vision_backbone": config.vision_backbone,
        "backbone_weights": config.backbone_weights,
        "freeze_backbone": config.freeze_backbone,
    }


def server_spec(config: FleetConfig) -> NodeSpec:
    """The fleet server node."""
    params: dict[str, Any] = {
        "algorithm": config.algorithm,
        "rounds": config.rounds,
        "num_clusters": config.num_clusters,
        "policy": config.policy,
        "seed": config.seed,
        "expected_robots": config.robot_ids,
        "state_dir": f"{config.run_dir}/server",
    }
    params.update(architecture_parameters(config))
    params.update({f"strategy.{k}": v for k, v in config.strategy.items()})
    params.update(config.server)
    if "min_robots" not in params:
        # All robots start round 0 together; if some never register, the fleet starts after
        # registration_timeout_s with a quorum of them instead of waiting forever.
        fraction = params.get("quorum_fraction", ServerParams.defaults()["quorum_fraction"])
        if isinstance(fraction, (int, float)) and 0 < fraction <= 1:
            params["min_robots"] = max(1, math.ceil(fraction * len(config.robots) - 1e-9))
    # Typed as the node declares them (e.g. 600 -> 600.0 for a float): a ROS node rejects an
    # integer override of a double parameter at start.
    return NodeSpec(
        PACKAGE, "server_node", SERVER_NODE_NAME, SERVER_NAMESPACE, ServerParams.coerce(params)
    )


def robot_spec(config: FleetConfig, robot: RobotConfig, index: int) -> NodeSpec:
    """The onboard robot node of one robot."""
    params: dict[str, Any] = {
        "robot_id": robot.robot_id,
        "tasks": list(robot.tasks),
        "variation": robot.variation,
        "policy": config.policy,
        "seed": config.seed + index,
        "demo_seed": 1000 * (config.seed + index),
        "data_dir": f"{config.run_dir}/{robot.robot_id}",
        **architecture_parameters(config),
    }
    if robot.sim:
        # Simulated arms share one machine: one torch thread each (oversubscribed CPU
        # threads made local training ~30x slower when measured on 2 cores).
        params["torch_threads"] = 1
    params.update(config.robot_defaults)
    params.update(robot.parameters)
    return NodeSpec(
        PACKAGE,
        "robot_node",
        ROBOT_NODE_NAME,
        f"/{robot.robot_id}",
        RobotParams.coerce(params),
        robot.remappings,
    )


def bridge_spec(config: FleetConfig, robot: RobotConfig, index: int) -> NodeSpec:
    """The MuJoCo bridge standing in for the robot's arm driver (sim robots only)."""
    params: dict[str, Any] = {
        "task": robot.tasks[0],
        "variation": robot.variation,
        "cameras": config.policy == "image",
        "seed": config.seed + index,
    }
    if robot.profile:  # the simulated arm offers only standard interfaces, for the adapter
        params.update(
            interface="ros2_control",
            profile=robot.profile,
            profile_overrides=_overrides_text(robot.arm),
        )
    params.update(config.bridge)
    params.update(robot.bridge_parameters)
    return NodeSpec(
        PACKAGE,
        "sim_bridge_node",
        BRIDGE_NODE_NAME,
        f"/{robot.robot_id}",
        BridgeParams.coerce(params),
    )


def _overrides_text(arm: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(arm), default_flow_style=True).strip() if arm else ""


def adapter_spec(config: FleetConfig, robot: RobotConfig) -> NodeSpec:
    """The arm adapter: the robot node's arm topics on the arm's standard interfaces."""
    params: dict[str, Any] = {
        "profile": robot.profile,
        "profile_overrides": _overrides_text(robot.arm),
        "task": robot.tasks[0],
        "cameras": config.policy == "image",
        # A simulated arm in lockstep steps only on answers: the adapter then ticks per arm state.
        "lockstep": bool(
            robot.sim and {**config.bridge, **robot.bridge_parameters}.get("lockstep", False)
        ),
        # The adapter ends the episodes the robot node runs: the same cap.
        "max_episode_steps": robot.parameters.get(
            "max_episode_steps", config.robot_defaults.get("max_episode_steps", MAX_EPISODE_STEPS)
        ),
    }
    return NodeSpec(
        PACKAGE,
        "arm_adapter_node",
        ADAPTER_NODE_NAME,
        f"/{robot.robot_id}",
        AdapterParams.coerce(params),
    )


def plan_fleet(
    config: FleetConfig, *, include_server: bool = True, robot_ids: Sequence[str] | None = None
) -> list[NodeSpec]:
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


@dataclass(frozen=True)
class ProcessSpec:
    """A fleet process that is not a ROS node (the discovery server): what both starters run."""

    name: str
    executable: str  # found beside the Python running the fleet, else on PATH
    arguments: tuple[str, ...]
    # An address it listens on, checked on the host that starts it ('' = none to check).
    listen_address: str = ""

    @property
    def fqn(self) -> str:
        """Its name where node names go (logs, fleet.json), e.g. ``/discovery_server``."""
        return f"/{self.name}"


DISCOVERY_SERVER_NAME = "discovery_server"


def plan_processes(config: FleetConfig, *, include_server: bool = True) -> list[ProcessSpec]:
    """Processes started before the nodes: the fleet's Discovery Server, on the server's host."""
    if include_server and config.discovery.mode == "start":
        return [
            ProcessSpec(
                DISCOVERY_SERVER_NAME,
                SERVER_EXECUTABLE,
                tuple(config.discovery.server_arguments()),
                config.discovery.address,
            )
        ]
    return []


def fleet_environment(config: FleetConfig) -> dict[str, str]:
    """Environment every process of the fleet gets on every host (ROS_DISCOVERY_SERVER)."""
    return config.discovery.environment()


def fleet_setup(
    config: FleetConfig, *, include_server: bool = True
) -> tuple[dict[str, str], list[ProcessSpec]]:
    """What runs before the nodes: the fleet's environment and its non-node processes."""
    return fleet_environment(config), plan_processes(config, include_server=include_server)


def format_plan(nodes: Sequence[NodeSpec]) -> str:
    """Human-readable table of a plan (what `fed-ros plan` prints)."""
    lines = [f"{'node':<22} {'executable':<18} parameters"]
    for n in nodes:
        params = ", ".join(f"{k}={v!r}" for k, v in sorted(n.parameters.items()))
        lines.append(f"{n.fqn:<22} {n.executable:<18} {params}")
        for src, dst in n.remappings:
            lines.append(f"{'':<22} {'':<18} remap {src} -> {dst}")
    return "\n".join(lines)


def launch_description(
    plan_nodes: Callable[..., list[NodeSpec]],
    arguments: Sequence[tuple[str, str, str]],
    plan_setup: Callable[..., tuple[dict[str, str], list[ProcessSpec]]] | None = None,
):
    """A ROS 2 LaunchDescription that starts ``plan_nodes(*argument values)``.

    ``arguments`` are (name, default, description) of the launch arguments, passed to
    ``plan_nodes`` (and ``plan_setup``) in order. ``plan_setup`` gives the fleet's environment
    (:func:`fleet_environment`) and the processes to start first (:func:`plan_processes`).
    The launch files call this so the NodeSpec -> launch_ros Node conversion exists once;
    launch / launch_ros are imported here, only when launching.
    """
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, ExecuteProcess, OpaqueFunction
    from launch.actions import SetEnvironmentVariable
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    from fed_ros.ros.fleet.discovery import check_listen_address, find_executable

    def nodes(context):
        values = [LaunchConfiguration(name).perform(context) for name, _, _ in arguments]
        specs = plan_nodes(*values)
        env, processes = plan_setup(*values) if plan_setup else ({}, [])
        for process in processes:
            if process.listen_address:
                check_listen_address(process.listen_address)
        # Set before the processes and nodes below: each takes the launch context's environment.
        setup = [SetEnvironmentVariable(k, v) for k, v in sorted(env.items())]
        setup += [
            ExecuteProcess(
                cmd=[find_executable(p.executable), *p.arguments], name=p.name, output="screen"
            )
            for p in processes
        ]
        return setup + [
            Node(
                package=s.package,
                executable=s.executable,
                name=s.name,
                namespace=s.namespace,
                parameters=[dict(s.parameters)],
                remappings=list(s.remappings),
                output="screen",
            )
            for s in specs
        ]

    declared = [
        DeclareLaunchArgument(name, default_value=default, description=description)
        for name, default, description in arguments
    ]
    return LaunchDescription([*declared, OpaqueFunction(function=nodes)])

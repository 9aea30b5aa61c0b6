"""The arm-side fleet nodes' parameters, each declared once (fed_ros.ros.configuration.param_spec).

``AdapterParams``, ``BridgeParams``, ``ExpertDriverParams`` and ``TeleopParams`` are what the
arm adapter, the MuJoCo sim bridge, the scripted expert driver and the teleoperation node
declare (with ParameterDescriptors), what the fleet plan and the launch files fill in, and what
a live ``ros2 param set`` is checked against. config/arm_adapter.yaml, sim_bridge.yaml,
expert_driver.yaml and teleop.yaml are documented examples of them; a test keeps their keys
and defaults equal to these. They stand apart from the server's and robot node's parameters
(:mod:`fed_ros.ros.configuration.fleet_params`, which also holds the names and checks all nodes
share) because they describe the arm and its drivers, not the federation. Pure Python, like the plan
that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import yaml

from fed_ros.ros.configuration.param_spec import NodeParams, param
from fed_ros.ros.configuration.fleet_params import MAX_EPISODE_STEPS, SIM_TASKS, not_empty

# The sim bridge's interfaces: fed_ros arm topics, or standard messages only.
ARM_INTERFACES = ("direct", "ros2_control")


def _yaml_mapping(value: str) -> str | None:
    """Profile overrides: '' or a YAML mapping.

    What fed_ros.core.arm.profile.parse_overrides takes.
    """
    if not value.strip():
        return None
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return "is not valid YAML"
    return None if isinstance(parsed, dict) else "must be a YAML mapping"


def _instructions(values: Any) -> str | None:
    # such an entry used to be skipped without a word
    bad = [v for v in values if v and "=" not in v]
    return f"has an entry {bad[0]!r} without '=' (entries are task=instruction)" if bad else None


@dataclass(frozen=True)
class AdapterParams(NodeParams):
    """Parameters of the arm adapter (fed_ros/ros/nodes/arm_adapter/arm_adapter_node.py)."""

    NODE: ClassVar[str] = "arm_adapter"

    profile: str = param(
        "panda_sim", "arm profile name (config/arm_profiles) or YAML path", check=not_empty
    )
    profile_overrides: str = param("", "YAML mapping merged into the profile", check=_yaml_mapping)
    max_episode_steps: int = param(
        MAX_EPISODE_STEPS,
        "steps before an episode is done (a running episode ends at the new cap)",
        unit="steps",
        ge=1,
        live=True,
    )
    state_timeout_s: float = param(0.5, "arm state older than this: not ready", unit="s", gt=0.0)
    cameras: bool = param(True, "relay the profile's cameras (false: low-dim policy)")
    image_size: int = param(
        84, "camera images resized to this side (0: as they come)", unit="px", ge=0
    )
    task: str = param("lift", "task until a reset names another", check=not_empty)
    instructions: tuple[str, ...] = param(
        ("",), "'task=instruction' entries ([''] = none: the task name)", check=_instructions
    )
    report_period_s: float = param(5.0, "how often missing arm topics are logged", unit="s", gt=0.0)
    lockstep: bool = param(
        False,
        "the arm steps only on a twist answering its state (sim_bridge_node "
        "lockstep:=true): each new complete arm state is one tick, no timer ticks "
        "(never for a real arm)",
    )

    @property
    def instruction_by_task(self) -> dict[str, str]:
        """Task -> instruction, from the ``task=instruction`` entries."""
        return dict(e.split("=", 1) for e in self.instructions if e)


@dataclass(frozen=True)
class BridgeParams(NodeParams):
    """Parameters of the MuJoCo sim bridge (fed_ros/ros/nodes/sim_bridge/sim_bridge_node.py)."""

    NODE: ClassVar[str] = "sim_bridge"

    task: str = param(
        "lift", "task of the first episode (a reset may switch it)", choices=SIM_TASKS
    )
    variation: str = param(
        "default", "named variation preset (fed_ros.sim.envs.VARIATIONS)", check=not_empty
    )
    cameras: bool = param(True, "render and publish agent-view and wrist images")
    image_size: int = param(
        84, "image side (fed_ros.sim.envs.ArmEnv's range)", unit="px", ge=16, le=1024
    )
    control_rate_hz: float = param(
        20.0, "control ticks per second (lockstep: ignored)", unit="Hz", gt=0.0
    )
    seed: int = param(0, "seed of the first episode (later ones: seed + episode)", ge=0)
    command_timeout_s: float = param(
        0.25,
        "a command older than this is stale and the arm holds still",
        unit="s",
        gt=0.0,
        live=True,
    )
    lockstep: bool = param(False, "step only on a command answering the current observation")
    lockstep_republish_s: float = param(
        1.0,
        "lockstep: re-send the current observation (same stamp) when no "
        "answering command came for this long (a lost best-effort sample "
        "must not stall the episode); 0 = never",
        unit="s",
        ge=0.0,
    )
    horizon: int = param(0, "steps per episode; 0 = task default", unit="steps", ge=0)
    frame_prefix: str = param("", "prefix of published frame ids")
    interface: str = param(
        "direct",
        "direct: the fed_ros arm topics; ros2_control: only standard messages, as a "
        "ros2_control + MoveIt Servo arm (fed_ros.ros.nodes.sim_bridge.ros2_control_sim)",
        choices=ARM_INTERFACES,
    )
    profile: str = param(
        "panda_sim",
        "arm profile of the ros2_control interface (topic names, scaling)",
        check=not_empty,
    )
    profile_overrides: str = param("", "YAML mapping merged into the profile", check=_yaml_mapping)


@dataclass(frozen=True)
class ExpertDriverParams(NodeParams):
    """Parameters of the scripted expert driver
    (fed_ros/ros/nodes/expert_driver/expert_driver_node.py)."""

    NODE: ClassVar[str] = "expert_driver"

    task: str = param("lift", "task family the expert solves", choices=SIM_TASKS)
    variation: str = param("default", "variation the arm resets into")
    episodes: int = param(1, "number of demonstrations", unit="episodes", ge=1)
    seed: int = param(0, "run seed (episode seeds as collect_demos)", ge=0)
    noise_std: float = param(
        0.0, "expert action noise (std of the normalised action)", ge=0.0, le=1.0
    )
    cameras: bool = param(True, "the arm publishes camera images")
    record_service: str = param("", "Record service to call (e.g. 'record'); '' = do not call one")
    record_dir: str = param("", "standalone recording directory (own Recorder); '' = none")
    robot_id: str = param("", "robot id written into recordings")
    episode_timeout_s: float = param(
        120.0,
        "give an episode up after this (from the next episode on)",
        unit="s",
        gt=0.0,
        live=True,
    )
    connect_timeout_s: float = param(
        60.0, "wait this long for the arm (and the Record service)", unit="s", gt=0.0
    )

    def _check(self) -> None:
        if self.record_service and self.record_dir:
            raise ValueError(
                "expert_driver parameters 'record_service' and 'record_dir' are both set "
                f"({self.record_service!r}, {self.record_dir!r}): set one of them"
            )


@dataclass(frozen=True)
class TeleopParams(NodeParams):
    """Parameters of the teleoperation node (fed_ros/ros/nodes/teleop/teleop_node.py,
    docs/teleop.md)."""

    NODE: ClassVar[str] = "teleop"

    profile: str = param(
        "xbox", "teleop profile name (config/teleop) or YAML path", check=not_empty
    )
    joy_topic: str = param(
        "joy",
        "sensor_msgs/Joy of the device (buttons, and axes with input: joy); spacenav: spacenav/joy",
    )
    twist_topic: str = param(
        "",
        "geometry_msgs/Twist of the device, read with input: twist ('' = none); "
        "spacenav: spacenav/twist",
    )
    rate_hz: float = param(
        20.0,
        "commands per second while the deadman is held (the arm profile's control rate)",
        unit="Hz",
        gt=0.0,
    )
    task: str = param("lift", "task named in Record START", check=not_empty)
    record_service: str = param(
        "record", "the robot node's fed_ros/srv/Record service", check=not_empty
    )
    record_timeout_s: float = param(
        10.0, "how long a Record call may take", unit="s", gt=0.0, live=True
    )
    log_period_s: float = param(
        2.0, "an unchanged hold reason is logged again after this long", unit="s", gt=0.0, live=True
    )

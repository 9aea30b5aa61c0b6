"""Launch the fleet server alone (robots run on their own computers: robot.launch.py).

ros2 launch fed_ros server.launch.py fleet:=/path/to/fleet.yaml
"""

from __future__ import annotations

import os

from fed_ros.ros.fleet.fleet_file import default_fleet_file, load_fleet_config
from fed_ros.ros.fleet.plan import (
    FleetConfig,
    NodeSpec,
    ProcessSpec,
    fleet_setup,
    launch_description,
    plan_fleet,
)


def _config(fleet: str) -> FleetConfig:
    return load_fleet_config(fleet or default_fleet_file(os.path.dirname(__file__)))


def plan_nodes(fleet: str = "") -> list[NodeSpec]:
    """The nodes this launch file starts: the server of the fleet, no robots."""
    config = _config(fleet)
    return plan_fleet(config, robot_ids=[])


def plan_setup(fleet: str = "") -> tuple[dict[str, str], list[ProcessSpec]]:
    """The fleet's environment (ROS_DISCOVERY_SERVER) and processes started before the nodes."""
    return fleet_setup(_config(fleet))


def generate_launch_description():
    """ROS 2 launch entry point (launch / launch_ros are imported only when it runs)."""
    return launch_description(
        plan_nodes,
        [
            ("fleet", default_fleet_file(os.path.dirname(__file__)), "fleet config YAML"),
        ],
        plan_setup,
    )

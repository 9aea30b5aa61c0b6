"""Launch one robot of a fleet on its onboard computer (its arm bridge if simulated, and
its robot node); the server runs elsewhere (server.launch.py).

    ros2 launch fed_ros robot.launch.py fleet:=/path/to/fleet.yaml robot_id:=robot_0
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


def plan_nodes(fleet: str = "", robot_id: str = "robot_0") -> list[NodeSpec]:
    """The nodes this launch file starts: the plan of ``robot_id`` without the server."""
    config = _config(fleet)
    return plan_fleet(config, include_server=False, robot_ids=[robot_id])


def plan_setup(
    fleet: str = "", robot_id: str = "robot_0"
) -> tuple[dict[str, str], list[ProcessSpec]]:
    """The fleet's environment (ROS_DISCOVERY_SERVER) and processes started before the nodes."""
    return fleet_setup(_config(fleet), include_server=False)


def generate_launch_description():
    """ROS 2 launch entry point (launch / launch_ros are imported only when it runs)."""
    return launch_description(
        plan_nodes,
        [
            ("fleet", default_fleet_file(os.path.dirname(__file__)), "fleet config YAML"),
            ("robot_id", "robot_0", "which robot of the fleet"),
        ],
        plan_setup,
    )

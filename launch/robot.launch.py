"""Launch one robot of a fleet on its onboard computer (its arm bridge if simulated, and
its robot node); the server runs elsewhere (server.launch.py).

    ros2 launch fed_ros robot.launch.py fleet:=/path/to/fleet.yaml robot_id:=robot_0
"""
from __future__ import annotations

import os

from fed_ros.ros.fleet_plan import NodeSpec, default_fleet_file, load_fleet_config, plan_fleet


def plan_nodes(fleet: str = "", robot_id: str = "robot_0") -> list[NodeSpec]:
    """The nodes this launch file starts: the plan of ``robot_id`` without the server."""
    config = load_fleet_config(fleet or default_fleet_file(os.path.dirname(__file__)))
    return plan_fleet(config, include_server=False, robot_ids=[robot_id])


def generate_launch_description():
    """ROS 2 launch entry point (needs launch / launch_ros, imported only here)."""
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    def nodes(context):
        specs = plan_nodes(LaunchConfiguration("fleet").perform(context),
                           LaunchConfiguration("robot_id").perform(context))
        return [Node(package=s.package, executable=s.executable, name=s.name, namespace=s.namespace,
                     parameters=[dict(s.parameters)], remappings=list(s.remappings), output="screen")
                for s in specs]

    return LaunchDescription([
        DeclareLaunchArgument("fleet", default_value=default_fleet_file(os.path.dirname(__file__)),
                              description="fleet config YAML"),
        DeclareLaunchArgument("robot_id", default_value="robot_0", description="which robot of the fleet"),
        OpaqueFunction(function=nodes),
    ])

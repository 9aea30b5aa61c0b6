"""The fleet plan: config validation, the node set, and that the launch files and
`fed-ros up` start exactly the same nodes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from fed_ros.ros.fleet import launcher
from fed_ros.ros.fleet.fleet_file import load_fleet_config
from fed_ros.ros.configuration.fleet_params import ALGORITHMS, SIM_TASKS, RobotParams, ServerParams
from fed_ros.ros.fleet.plan import plan_fleet
from support.fleets import fleet_config

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "config" / "fleet_demo.yaml"


def _fleet(**overrides):
    robots = [{"task": "lift"}, {"task": "lift"}, {"task": "stack", "count": 2}]
    return fleet_config(**{"algorithm": "feddrman", "rounds": 2, "robots": robots, **overrides})


def _load_launch(name: str):
    spec = importlib.util.spec_from_file_location(name.replace(".", "_"), REPO / "launch" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # must not need launch / launch_ros at import time
    return module


def test_plan_has_server_bridges_and_robots_in_their_namespaces():
    nodes = plan_fleet(_fleet())
    assert [n.fqn for n in nodes] == [
        "/fleet/server",
        "/robot_0/arm",
        "/robot_0/robot",
        "/robot_1/arm",
        "/robot_1/robot",
        "/robot_2/arm",
        "/robot_2/robot",
        "/robot_3/arm",
        "/robot_3/robot",
    ]
    server = nodes[0]
    assert server.parameters["expected_robots"] == ["robot_0", "robot_1", "robot_2", "robot_3"]
    assert (
        server.parameters["algorithm"] == "feddrman"
        and server.parameters["state_dir"] == "runs/t/server"
    )
    assert (
        server.parameters["min_robots"] == 3
    )  # a quorum (0.75 of 4) may start without a lost robot
    robot3 = next(n for n in nodes if n.fqn == "/robot_3/robot")
    assert robot3.parameters["tasks"] == ["stack"] and robot3.parameters["robot_id"] == "robot_3"
    bridge3 = next(n for n in nodes if n.fqn == "/robot_3/arm")
    assert bridge3.parameters["task"] == "stack" and bridge3.parameters["cameras"] is False


def test_real_robot_gets_no_bridge_and_keeps_remappings():
    config = _fleet(
        robots=[
            {
                "id": "ur5",
                "tasks": ["wipe"],
                "sim": False,
                "remappings": {"arm/command": "/ur5_driver/command"},
            }
        ]
    )
    nodes = plan_fleet(config)
    assert [n.fqn for n in nodes] == ["/fleet/server", "/ur5/robot"]
    assert nodes[1].remappings == (("arm/command", "/ur5_driver/command"),)


def test_plan_subsets_for_one_machine():
    config = _fleet()
    assert [n.fqn for n in plan_fleet(config, robot_ids=[])] == ["/fleet/server"]
    assert [n.fqn for n in plan_fleet(config, include_server=False, robot_ids=["robot_1"])] == [
        "/robot_1/arm",
        "/robot_1/robot",
    ]
    with pytest.raises(ValueError, match="robot_9"):
        plan_fleet(config, robot_ids=["robot_9"])


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"algorithm": "fedsgd"}, "algorithm"),
        ({"rounds": 0}, "rounds"),
        ({"robots": [{"task": "juggle"}]}, "juggle"),
        (
            {"robots": [{"id": "a", "task": "lift"}, {"id": "a", "task": "lift"}]},
            "duplicate robot ids",
        ),
        ({"robots": [{"task": "lift", "colour": "red"}]}, "colour"),
        ({"server": {"quorum_fraction": 1.5}}, "quorum_fraction"),
        ({"server": {"round_timeout": 3}}, "round_timeout"),
        # A renamed parameter is refused with its new name (one name per idea, issue 38).
        (
            {"server": {"max_train_steps": 100}},
            "server parameter 'max_train_steps' was renamed 'heartbeat_step_budget'",
        ),
        ({"robot_defaults": {"train_lr": "fast"}}, "train_lr"),
        ({"policy": "pixels"}, "policy"),
        ({"speed": 3}, "speed"),
        # The sim bridge's and the arm adapter's parameters are typed at plan time too
        # (BridgeParams, AdapterParams).
        (
            {"bridge": {"control_rate_hz": 0}},
            r"sim_bridge parameter 'control_rate_hz' must be > 0.0 Hz, got 0",
        ),
        (
            {"bridge": {"lockstep_republish": 1.0}},
            "unknown sim_bridge parameter 'lockstep_republish'",
        ),
        (
            {
                "robots": [
                    {
                        "task": "lift",
                        "profile": "ur5e",
                        "sim": False,
                        "parameters": {"max_episode_steps": "long"},
                    }
                ]
            },
            "arm_adapter parameter 'max_episode_steps' must be an integer, got 'long'",
        ),
    ],
)
def test_bad_configs_name_the_offending_value(overrides, match):
    with pytest.raises(ValueError, match=match):
        _fleet(**overrides)


def test_node_validators_name_bad_parameters():
    with pytest.raises(ValueError, match="'rounds'"):
        ServerParams.from_mapping({"rounds": "three"})
    with pytest.raises(ValueError, match="'expected_robots'"):
        ServerParams.from_mapping({"expected_robots": ["bad id"]})
    assert ServerParams.from_mapping({"strategy.beta": 0.9}).extra["strategy.beta"] == 0.9
    with pytest.raises(ValueError, match="'device'"):
        RobotParams.from_mapping({"device": "tpu"}, namespace="/robot_0")
    params = RobotParams.from_mapping({}, namespace="/robot_7")
    assert params.robot_id == "robot_7" and params.data_dir == "runs/robots/robot_7"


def test_demo_fleet_file_loads():
    demo = load_fleet_config(DEMO)
    assert len(demo.robots) == 4 and demo.algorithm == "feddrman"
    assert len({(r.tasks, r.variation) for r in demo.robots}) == 2  # two task families
    # A demo fleet has no stragglers: round 0 and every round wait for all robots, so the
    # table does not depend on which robot a loaded machine made slowest.
    from fed_ros.ros.fleet.plan import server_spec

    server = server_spec(demo).parameters
    assert server["quorum_fraction"] == 1.0 and server["min_robots"] == len(demo.robots)


def test_literal_lists_match_core_and_sim():
    from fed_ros.core.strategies.base import STRATEGIES

    assert set(ALGORITHMS) == set(STRATEGIES)
    from fed_ros.sim.envs import TASKS

    assert set(SIM_TASKS) == set(TASKS)


def test_launch_files_and_up_start_the_same_nodes(tmp_path):
    config = load_fleet_config(DEMO)
    plan = plan_fleet(config)
    up_nodes = launcher.build_commands(plan, tmp_path)
    fleet_launch = _load_launch("sim_fleet.launch.py").plan_nodes(str(DEMO))
    assert fleet_launch == plan
    assert [c.spec for c in up_nodes] == plan
    # `fed-ros up` passes exactly the plan's name, namespace and parameters on the command line.
    for cmd in up_nodes:
        argv = cmd.argv
        assert f"__node:={cmd.spec.name}" in argv and f"__ns:={cmd.spec.namespace}" in argv
        params = yaml.safe_load(Path(argv[argv.index("--params-file") + 1]).read_text())
        assert params == {cmd.spec.fqn: {"ros__parameters": dict(cmd.spec.parameters)}}
    # Server + robot launch files on separate machines together give the whole fleet.
    split = _load_launch("server.launch.py").plan_nodes(str(DEMO))
    for rid in config.robot_ids:
        split += _load_launch("robot.launch.py").plan_nodes(str(DEMO), rid)
    assert sorted(n.fqn for n in split) == sorted(n.fqn for n in plan)


def test_launch_description_matches_plan():
    pytest.importorskip(
        "launch_ros",
        reason="launch_ros is not installed (make test installs it from "
        "../shared/tools/ros2-launch when that folder exists)",
    )
    from launch import LaunchContext
    from launch_ros.actions import Node

    module = _load_launch("sim_fleet.launch.py")
    description = module.generate_launch_description()
    context = LaunchContext()
    nodes = []
    for entity in description.entities:
        # DeclareLaunchArgument sets its default; OpaqueFunction returns the planned Nodes.
        nodes += [n for n in (entity.visit(context) or []) if isinstance(n, Node)]
    assert sorted((n.node_package, n.node_executable) for n in nodes) == sorted(
        (s.package, s.executable) for s in module.plan_nodes(str(DEMO))
    )

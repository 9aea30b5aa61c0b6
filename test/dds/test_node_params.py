"""Typed node parameters: one declaration (fed_ros.ros.configuration.fleet_params, arm_params) gives
the defaults, the documented config files, the ParameterDescriptors and the live set-parameters
checks.

The ROS tests start real nodes and change their parameters through rclpy's parameter client
(the rcl_interfaces/srv/SetParameters service `ros2 param set` calls), over DDS.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import wait_until
from fed_ros.ros.configuration.arm_params import (
    AdapterParams,
    BridgeParams,
    ExpertDriverParams,
    TeleopParams,
)
from fed_ros.ros.configuration.fleet_params import RobotParams, ServerParams

REPO = Path(__file__).resolve().parents[2]
ALL_PARAMS = [
    ServerParams,
    RobotParams,
    AdapterParams,
    BridgeParams,
    ExpertDriverParams,
    TeleopParams,
]


@pytest.mark.parametrize(
    "cls, path, key",
    [
        (ServerParams, "config/server.yaml", "/fleet/server"),
        (RobotParams, "config/robot.yaml", "/**/robot"),
        (AdapterParams, "config/arm_adapter.yaml", "/**/arm_adapter"),
        (BridgeParams, "config/sim_bridge.yaml", "/**/sim_bridge"),
        (ExpertDriverParams, "config/expert_driver.yaml", "/**/expert_driver"),
        (TeleopParams, "config/teleop.yaml", "/**/teleop"),
    ],
)
def test_config_yaml_documents_every_parameter_with_its_default(cls, path, key):
    documented = yaml.safe_load((REPO / path).read_text())[key]["ros__parameters"]
    assert list(documented) == list(cls.defaults()), f"{path} keys differ from {cls.__name__}"
    for name, default in cls.defaults().items():
        value = documented[name]
        assert value == default and type(value) is type(default), (
            f"{path}: {name}: {value!r} documented, {default!r} declared"
        )


@pytest.mark.parametrize("cls", ALL_PARAMS)
def test_every_parameter_has_a_description_and_a_valid_default(cls):
    for name, spec in cls.specs().items():
        assert spec.description, name
        if name != "robot_id":  # "" = from the namespace, resolved by from_mapping
            spec.coerce(cls.NODE, spec.default)


def test_bad_values_name_the_parameter_and_the_value():
    with pytest.raises(
        ValueError, match=r"server parameter 'quorum_fraction' must be <= 1.0, got 1.5"
    ):
        ServerParams.from_mapping({"quorum_fraction": 1.5})
    with pytest.raises(ValueError, match=r"robot parameter 'train_lr' must be > 0.0, got -0.1"):
        RobotParams.from_mapping({"train_lr": -0.1}, namespace="/r")
    with pytest.raises(ValueError, match=r"unknown robot parameter 'train_rl'"):
        RobotParams.from_mapping({"train_rl": 0.1}, namespace="/r")
    p = RobotParams.from_mapping({"train_lr": 1}, namespace="/r")  # an integer for a float is fine
    assert p.train_lr == 1.0 and type(p.train_lr) is float
    with pytest.raises(ValueError, match=r"'eval_episodes' must be >= 1 episodes, got 0"):
        p.replace(eval_episodes=0)


@pytest.mark.parametrize(
    "cls, values, message",
    [
        (
            AdapterParams,
            {"image_size": -1},
            "arm_adapter parameter 'image_size' must be >= 0 px, got -1",
        ),
        (
            AdapterParams,
            {"profile_overrides": "[1, 2]"},
            "arm_adapter parameter 'profile_overrides' must be a YAML mapping, got '[1, 2]'",
        ),
        (
            AdapterParams,
            {"instructions": ["lift=pick it up", "stack"]},
            "arm_adapter parameter 'instructions' has an entry 'stack' without '='",
        ),
        (
            BridgeParams,
            {"image_size": 8},
            "sim_bridge parameter 'image_size' must be >= 16 px, got 8",
        ),
        (
            BridgeParams,
            {"interface": "moveit"},
            "sim_bridge parameter 'interface' must be one of "
            "('direct', 'ros2_control'), got 'moveit'",
        ),
        (
            BridgeParams,
            {"lockstep_republish_s": -0.5},
            "sim_bridge parameter 'lockstep_republish_s' must be >= 0.0 s",
        ),
        (
            ExpertDriverParams,
            {"noise_std": 1.5},
            "expert_driver parameter 'noise_std' must be <= 1.0, got 1.5",
        ),
        (
            ExpertDriverParams,
            {"record_service": "record", "record_dir": "/tmp/demos"},
            "expert_driver parameters 'record_service' and 'record_dir' are both set",
        ),
    ],
)
def test_arm_side_nodes_refuse_what_they_used_to_refuse_or_ignore(cls, values, message):
    with pytest.raises(ValueError) as err:
        cls.from_mapping(values)
    assert str(err.value).startswith(message)


def test_the_episode_cap_has_one_default_and_the_instructions_map_tasks():
    assert (
        AdapterParams.defaults()["max_episode_steps"] == RobotParams.defaults()["max_episode_steps"]
    )
    p = AdapterParams.from_mapping({"instructions": ["lift=raise the cube", "stack=a=b"]})
    assert p.instruction_by_task == {"lift": "raise the cube", "stack": "a=b"}
    assert AdapterParams.from_mapping({}).instruction_by_task == {}


def test_descriptors_carry_type_range_and_read_only():
    pytest.importorskip("rclpy")
    from rcl_interfaces.msg import ParameterType
    from fed_ros.ros.nodes.typed_params import descriptor_for

    quorum = descriptor_for(ServerParams.specs()["quorum_fraction"])
    assert (
        quorum.type == ParameterType.PARAMETER_DOUBLE
        and quorum.read_only
        and "fraction" in quorum.description
    )
    lr = descriptor_for(RobotParams.specs()["train_lr"])
    assert not lr.read_only and "changes apply live" in lr.description
    channel = descriptor_for(RobotParams.specs()["transfer_channel"])
    assert "zmq" in channel.additional_constraints
    noise = descriptor_for(ExpertDriverParams.specs()["noise_std"])
    assert noise.read_only and noise.floating_point_range[0].to_value == 1.0
    image = descriptor_for(BridgeParams.specs()["image_size"])
    assert image.type == ParameterType.PARAMETER_INTEGER and image.integer_range[0].from_value == 16


# ------------------------------------------------------------------------------ over DDS
def _spin(node, context):
    from rclpy.executors import SingleThreadedExecutor

    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    stop = threading.Event()

    def run():
        while not stop.is_set() and context.ok():
            executor.spin_once(timeout_sec=0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return stop, thread


def _set(fqn: str, context, **values):
    """``ros2 param set``: rclpy's parameter client calls <node>/set_parameters over DDS.

    Asked again while unanswered (fed_ros.ros.wire.service_calls: Fast DDS can drop a response
    under load; CI saw it); setting the same values twice is harmless.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from rclpy.parameter_client import AsyncParameterClient
    from fed_ros.ros.wire.service_calls import call_until_answered, spinning

    caller = rclpy.create_node("param_caller", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(caller)
    try:
        client = AsyncParameterClient(caller, fqn)
        assert client.wait_for_services(timeout_sec=30.0), (
            f"{fqn}'s parameter services never appeared"
        )
        return call_until_answered(
            lambda: client.set_parameters([Parameter(k, value=v) for k, v in values.items()]),
            spinning(lambda s: executor.spin_once(timeout_sec=s)),
            attempt_s=10.0,
            timeout_s=60.0,
            what=f"set_parameters {values} on {fqn}",
        ).results
    finally:
        executor.shutdown()
        caller.destroy_node()


@pytest.fixture
def contexts(ros_env):
    import rclpy

    node_ctx, caller_ctx = rclpy.Context(), rclpy.Context()  # two DDS participants
    rclpy.init(context=node_ctx)
    rclpy.init(context=caller_ctx)
    yield node_ctx, caller_ctx
    rclpy.try_shutdown(context=caller_ctx)
    rclpy.try_shutdown(context=node_ctx)


@pytest.mark.ros
def test_robot_node_applies_live_changes_and_refuses_read_only_and_invalid(
    contexts, tmp_path, torch_one_thread
):
    from rclpy.parameter import Parameter
    from fed_ros.ros.nodes.robot.robot_node import RobotNode

    node_ctx, caller_ctx = contexts
    node = RobotNode(
        context=node_ctx,
        namespace="/robot_p",
        parameter_overrides=[
            Parameter("data_dir", value=str(tmp_path)),
            Parameter("register_timeout_s", value=600),
            Parameter("trainer.weight_decay", value=0.25),
        ],
    )
    stop, thread = _spin(node, node_ctx)
    try:
        assert node.params.register_timeout_s == 600.0  # an integer override of a double parameter
        ok = _set("/robot_p/robot", caller_ctx, train_lr=0.003, eval_episodes=5)
        assert [r.successful for r in ok] == [True, True]
        assert node.params.train_lr == 0.003 and node.params.eval_episodes == 5
        assert (
            node.client.local["lr"] == 0.003 and node.client.local["weight_decay"] == 0.25
        )  # next fit uses it

        read_only = _set("/robot_p/robot", caller_ctx, robot_id="robot_x")[0]
        assert (
            not read_only.successful
            and "read-only" in read_only.reason
            and "robot_id" in read_only.reason
        )
        assert node.params.robot_id == "robot_p"

        invalid = _set("/robot_p/robot", caller_ctx, eval_episodes=0)[0]
        assert not invalid.successful
        assert invalid.reason == "robot parameter 'eval_episodes' must be >= 1 episodes, got 0"
        assert node.params.eval_episodes == 5 and node.get_parameter("eval_episodes").value == 5
    finally:
        stop.set()
        thread.join()
        node.destroy_node()


@pytest.mark.ros
def test_server_node_applies_round_timing_live_and_refuses_the_algorithm(
    contexts, tmp_path, torch_one_thread
):
    from rclpy.parameter import Parameter
    from fed_ros.ros.nodes.server.server_node import FleetServer

    node_ctx, caller_ctx = contexts
    node = FleetServer(
        context=node_ctx,
        namespace="/fleet",
        parameter_overrides=[
            Parameter("state_dir", value=str(tmp_path)),
            Parameter("algorithm", value="fedprox"),
            Parameter("strategy.mu", value=0.01),
        ],
    )
    stop, thread = _spin(node, node_ctx)
    try:
        ok = _set("/fleet/server", caller_ctx, round_timeout_s=42.5)[0]
        assert (
            ok.successful and node.coord.settings.round_timeout_s == 42.5
        )  # the next deadline uses it
        refused = _set("/fleet/server", caller_ctx, algorithm="fedavg")[0]
        assert not refused.successful and "algorithm" in refused.reason
        invalid = _set("/fleet/server", caller_ctx, round_timeout_s=-1.0)[0]
        assert (
            not invalid.successful
            and "'round_timeout_s'" in invalid.reason
            and "-1.0" in invalid.reason
        )
        assert node.coord.settings.round_timeout_s == 42.5
    finally:
        stop.set()
        thread.join()
        node.destroy_node()


def test_unknown_or_mistyped_override_stops_the_node_naming_it(ros_env, tmp_path):
    import rclpy
    from rclpy.parameter import Parameter
    from fed_ros.ros.nodes.server.server_node import FleetServer

    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        with pytest.raises(ValueError, match="unknown server parameter 'round'"):
            FleetServer(context=context, parameter_overrides=[Parameter("round", value=3)])
        with pytest.raises(
            ValueError, match="server parameter 'rounds' must be an integer, got 'three'"
        ):
            FleetServer(
                context=context,
                parameter_overrides=[
                    Parameter("rounds", value="three"),
                    Parameter("state_dir", value=str(tmp_path)),
                ],
            )
    finally:
        rclpy.try_shutdown(context=context)


# ---------------------------------------------------------- arm-side nodes, each in its own process
@dataclass(frozen=True)
class NodeCase:
    """One arm-side node started from its documented params file, and what `ros2 param set` must do
    to it."""

    module: str
    node: str  # node name; it runs as /robot_p/<node>
    start: dict  # -p overrides on top of config/<node>.yaml
    read_only: dict  # refused by rclpy (the descriptor is read-only)
    live: dict  # accepted and applied by the node's on_change
    applied: str  # what the node logs once it has applied `live`
    invalid: dict = field(default_factory=dict)  # a live parameter with a bad value
    invalid_reason: str = ""


NODE_CASES = [
    # No arm behind it: the adapter waits for one, its parameter services answer meanwhile.
    NodeCase(
        "fed_ros.ros.nodes.arm_adapter.arm_adapter_node",
        "arm_adapter",
        {"cameras": "false"},
        read_only={"profile": "ur5e"},
        live={"max_episode_steps": 7},
        applied="episodes now end after 7 steps",
        invalid={"max_episode_steps": 0},
        invalid_reason="arm_adapter parameter 'max_episode_steps' must be >= 1 steps, got 0",
    ),
    NodeCase(
        "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
        "sim_bridge",
        {"cameras": "false", "lockstep": "true"},
        read_only={"task": "stack"},
        live={"command_timeout_s": 0.5},
        applied="commands are stale after 0.5 s",
        invalid={"command_timeout_s": -1.0},
        invalid_reason="sim_bridge parameter 'command_timeout_s' must be > 0.0 s, got -1.0",
    ),
    # No arm either: the driver waits for one (connect_timeout_s) while the test sets its
    # parameters.
    NodeCase(
        "fed_ros.ros.nodes.expert_driver.expert_driver_node",
        "expert_driver",
        {"cameras": "false", "connect_timeout_s": "600.0"},
        read_only={"episodes": 5},
        live={"episode_timeout_s": 30.0},
        applied="the next episode is given up after 30 s",
        invalid={"episode_timeout_s": 0.0},
        invalid_reason="expert_driver parameter 'episode_timeout_s' must be > 0.0 s, got 0.0",
    ),
    # No pad, no arm: the teleop node holds and answers its parameter services.
    NodeCase(
        "fed_ros.ros.nodes.teleop.teleop_node",
        "teleop",
        {},
        read_only={"rate_hz": 50.0},
        live={"record_timeout_s": 3.0},
        applied="parameters applied: record_timeout_s=3",
        invalid={"log_period_s": 0.0},
        invalid_reason="teleop parameter 'log_period_s' must be > 0.0 s, got 0.0",
    ),
]


@pytest.fixture
def caller_context(ros_env):
    import rclpy

    context = rclpy.Context()  # its own DDS participant, talking to the node's process
    rclpy.init(context=context)
    yield context
    rclpy.try_shutdown(context=context)


@pytest.mark.ros
@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.node)
def test_node_process_applies_live_changes_and_refuses_read_only_and_invalid(
    case, caller_context, processes, ros_env, tmp_path
):
    log = tmp_path / f"{case.node}.log"
    args = [
        "-m",
        case.module,
        "--ros-args",
        "-r",
        "__ns:=/robot_p",
        "--params-file",
        str(REPO / "config" / f"{case.node}.yaml"),
    ]  # the documented file starts the node
    for name, value in case.start.items():
        args += ["-p", f"{name}:={value}"]
    proc = processes.python(args, ros_env, log_path=log)
    fqn = f"/robot_p/{case.node}"
    tail = lambda: log.read_text(errors="replace")[-3000:]  # noqa: E731

    [name] = case.read_only
    read_only = _set(fqn, caller_context, **case.read_only)[0]
    assert not read_only.successful, tail()
    assert "read-only" in read_only.reason and name in read_only.reason, read_only.reason

    assert [r.successful for r in _set(fqn, caller_context, **case.live)] == [True] * len(
        case.live
    ), tail()
    wait_until(
        lambda: case.applied in log.read_text(errors="replace"),
        30.0,
        f"{case.node} applying {case.live}",
        diagnostics=tail,
    )

    invalid = _set(fqn, caller_context, **case.invalid)[0]
    assert not invalid.successful and invalid.reason == case.invalid_reason
    assert proc.poll() is None, tail()  # refusals leave the node running


@pytest.mark.ros
@pytest.mark.parametrize(
    "module, overrides, message",
    [
        (
            "fed_ros.ros.nodes.arm_adapter.arm_adapter_node",
            ["state_timeout_s:=0.0"],
            "arm_adapter parameter 'state_timeout_s' must be > 0.0 s, got 0.0",
        ),
        (
            "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
            ["task:=juggle"],
            "sim_bridge parameter 'task' must be one of ('lift', 'pick_place_can', 'stack'), got "
            "'juggle'",
        ),
        (
            "fed_ros.ros.nodes.expert_driver.expert_driver_node",
            ["record_service:=record", "record_dir:=demos"],
            "expert_driver parameters 'record_service' and 'record_dir' are both set ('record', "
            "'demos')",
        ),
        (
            "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
            ["command_timeout:=1.0"],
            "unknown sim_bridge parameter 'command_timeout'",
        ),
    ],
    ids=["adapter", "bridge", "expert", "unknown"],
)
def test_a_bad_value_at_start_stops_the_node_naming_it(module, overrides, message, ros_env):
    args = [sys.executable, "-m", module, "--ros-args"] + [a for o in overrides for a in ("-p", o)]
    done = subprocess.run(args, env=ros_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr

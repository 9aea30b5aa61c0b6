"""Typed node parameters: one declaration (fed_ros.ros.fleet.params) gives the defaults, the
documented config files, the ParameterDescriptors and the live set-parameters checks.

The ROS tests start real nodes and change their parameters through rclpy's parameter client
(the rcl_interfaces/srv/SetParameters service `ros2 param set` calls), over DDS.
"""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from fed_ros.ros.fleet.params import RobotParams, ServerParams

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("cls, path, key", [(ServerParams, "config/server.yaml", "/fleet/server"),
                                            (RobotParams, "config/robot.yaml", "/**/robot")])
def test_config_yaml_documents_every_parameter_with_its_default(cls, path, key):
    documented = yaml.safe_load((REPO / path).read_text())[key]["ros__parameters"]
    assert list(documented) == list(cls.defaults()), f"{path} keys differ from {cls.__name__}"
    for name, default in cls.defaults().items():
        value = documented[name]
        assert value == default and type(value) is type(default), (
            f"{path}: {name}: {value!r} documented, {default!r} declared")


@pytest.mark.parametrize("cls", [ServerParams, RobotParams])
def test_every_parameter_has_a_description_and_a_valid_default(cls):
    for name, spec in cls.specs().items():
        assert spec.description, name
        if name != "robot_id":  # "" = from the namespace, resolved by from_mapping
            spec.coerce(cls.NODE, spec.default)


def test_bad_values_name_the_parameter_and_the_value():
    with pytest.raises(ValueError, match=r"server parameter 'quorum_fraction' must be <= 1.0, got 1.5"):
        ServerParams.from_mapping({"quorum_fraction": 1.5})
    with pytest.raises(ValueError, match=r"robot parameter 'train_lr' must be > 0.0, got -0.1"):
        RobotParams.from_mapping({"train_lr": -0.1}, namespace="/r")
    with pytest.raises(ValueError, match=r"unknown robot parameter 'train_rl'"):
        RobotParams.from_mapping({"train_rl": 0.1}, namespace="/r")
    p = RobotParams.from_mapping({"train_lr": 1}, namespace="/r")  # an integer for a float is fine
    assert p.train_lr == 1.0 and type(p.train_lr) is float
    with pytest.raises(ValueError, match=r"'eval_episodes' must be >= 1 episodes, got 0"):
        p.replace(eval_episodes=0)


def test_descriptors_carry_type_range_and_read_only():
    pytest.importorskip("rclpy")
    from rcl_interfaces.msg import ParameterType
    from fed_ros.ros.nodes.typed_params import descriptor_for
    quorum = descriptor_for(ServerParams.specs()["quorum_fraction"])
    assert quorum.type == ParameterType.PARAMETER_DOUBLE and quorum.read_only and "fraction" in quorum.description
    lr = descriptor_for(RobotParams.specs()["train_lr"])
    assert not lr.read_only and "changes apply live" in lr.description
    channel = descriptor_for(RobotParams.specs()["transfer_channel"])
    assert "zmq" in channel.additional_constraints


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
        assert client.wait_for_services(timeout_sec=30.0), f"{fqn}'s parameter services never appeared"
        return call_until_answered(lambda: client.set_parameters([Parameter(k, value=v) for k, v in values.items()]),
                                   spinning(lambda s: executor.spin_once(timeout_sec=s)), attempt_s=10.0,
                                   timeout_s=60.0, what=f"set_parameters {values} on {fqn}").results
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
def test_robot_node_applies_live_changes_and_refuses_read_only_and_invalid(contexts, tmp_path, torch_one_thread):
    from rclpy.parameter import Parameter
    from fed_ros.ros.nodes.robot_node import RobotNode
    node_ctx, caller_ctx = contexts
    node = RobotNode(context=node_ctx, namespace="/robot_p", parameter_overrides=[
        Parameter("data_dir", value=str(tmp_path)), Parameter("register_timeout_s", value=600),
        Parameter("trainer.weight_decay", value=0.25)])
    stop, thread = _spin(node, node_ctx)
    try:
        assert node.params.register_timeout_s == 600.0  # an integer override of a double parameter
        ok = _set("/robot_p/robot", caller_ctx, train_lr=0.003, eval_episodes=5)
        assert [r.successful for r in ok] == [True, True]
        assert node.params.train_lr == 0.003 and node.params.eval_episodes == 5
        assert node.client.local["lr"] == 0.003 and node.client.local["weight_decay"] == 0.25  # next fit uses it

        read_only = _set("/robot_p/robot", caller_ctx, robot_id="robot_x")[0]
        assert not read_only.successful and "read-only" in read_only.reason and "robot_id" in read_only.reason
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
def test_server_node_applies_round_timing_live_and_refuses_the_algorithm(contexts, tmp_path, torch_one_thread):
    from rclpy.parameter import Parameter
    from fed_ros.ros.nodes.server_node import FleetServer
    node_ctx, caller_ctx = contexts
    node = FleetServer(context=node_ctx, namespace="/fleet", parameter_overrides=[
        Parameter("state_dir", value=str(tmp_path)), Parameter("algorithm", value="fedprox"),
        Parameter("strategy.mu", value=0.01)])
    stop, thread = _spin(node, node_ctx)
    try:
        ok = _set("/fleet/server", caller_ctx, round_timeout_s=42.5)[0]
        assert ok.successful and node.coord.settings.round_timeout_s == 42.5  # the next deadline uses it
        refused = _set("/fleet/server", caller_ctx, algorithm="fedavg")[0]
        assert not refused.successful and "algorithm" in refused.reason
        invalid = _set("/fleet/server", caller_ctx, round_timeout_s=-1.0)[0]
        assert not invalid.successful and "'round_timeout_s'" in invalid.reason and "-1.0" in invalid.reason
        assert node.coord.settings.round_timeout_s == 42.5
    finally:
        stop.set()
        thread.join()
        node.destroy_node()


def test_unknown_or_mistyped_override_stops_the_node_naming_it(ros_env, tmp_path):
    import rclpy
    from rclpy.parameter import Parameter
    from fed_ros.ros.nodes.server_node import FleetServer
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        with pytest.raises(ValueError, match="unknown server parameter 'round'"):
            FleetServer(context=context, parameter_overrides=[Parameter("round", value=3)])
        with pytest.raises(ValueError, match="server parameter 'rounds' must be an integer, got 'three'"):
            FleetServer(context=context, parameter_overrides=[Parameter("rounds", value="three"),
                                                              Parameter("state_dir", value=str(tmp_path))])
    finally:
        rclpy.try_shutdown(context=context)

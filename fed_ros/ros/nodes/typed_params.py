"""Declare a node's typed parameters (fed_ros.ros.configuration.param_spec) on an rclpy node.

Each parameter gets a ParameterDescriptor (description with unit, type, an integer or
floating-point range where both ends are inclusive, read_only unless it can change live).
A set-parameters callback (the ros2/demos set_parameters_callback shape) checks every live
change against the same declaration and either applies it (a checked copy of the params is
handed to the node) or rejects it with a reason naming the parameter and the value; nothing
is ignored silently. Read-only parameters are refused by rclpy itself
("Trying to set a read-only parameter: <name>.").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    SetParametersResult,
)
from rclpy.node import Node
from rclpy.parameter import Parameter

from fed_ros.ros.configuration.param_spec import NodeParams, ParamSpec

P = TypeVar("P", bound=NodeParams)

_TYPES = {
    bool: Parameter.Type.BOOL,
    int: Parameter.Type.INTEGER,
    float: Parameter.Type.DOUBLE,
    str: Parameter.Type.STRING,
    list: Parameter.Type.STRING_ARRAY,
}
# Declared by rclpy on every node; not ours to check.
ROS_BUILTIN_PARAMS = frozenset({"use_sim_time", "start_type_description_service"})


def descriptor_for(spec: ParamSpec) -> ParameterDescriptor:
    """The ParameterDescriptor of one typed parameter."""
    d = ParameterDescriptor(
        name=spec.name,
        type=_TYPES[spec.type].value,
        description=spec.describe(),
        read_only=not spec.live,
    )
    if spec.choices:
        d.additional_constraints = f"one of: {', '.join(spec.choices)}"
    if spec.ge is not None and spec.le is not None:  # ROS ranges are inclusive at both ends
        if spec.type is int:
            d.integer_range = [IntegerRange(from_value=int(spec.ge), to_value=int(spec.le), step=0)]
        elif spec.type is float:
            d.floating_point_range = [
                FloatingPointRange(from_value=float(spec.ge), to_value=float(spec.le), step=0.0)
            ]
    return d


def _override_value(node: Node, spec: ParamSpec):
    """The launch/params-file value of a parameter (an integer given for a double becomes a
    float)."""
    override = node._parameter_overrides.get(spec.name)  # rclpy keeps --ros-args overrides here
    if override is None:
        return None
    value = override.value
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec.type is list and isinstance(value, (list, tuple)) and len(value) == 0:
        return [""]  # an empty YAML list arrives untyped; ROS needs one element to type it
    return value


def declare_typed_parameters(
    node: Node, cls: type[P], on_change: Callable[[P], None], **context
) -> P:
    """Declare ``cls``'s parameters on ``node``, validate them, and install the live-change
    callback.

    Returns the validated parameters; ``on_change(new_params)`` runs after every accepted
    ``ros2 param set``. ValueError (naming the parameter and value) on a bad or unknown one.
    """
    specs = cls.specs()
    overrides = set(node._parameter_overrides) - ROS_BUILTIN_PARAMS
    unknown = sorted(n for n in overrides if n not in specs and not cls.is_open(n))
    if unknown:
        raise ValueError(cls.unknown_parameter(unknown[0]))
    values = {}
    for name, spec in specs.items():
        given = _override_value(node, spec)
        default = list(spec.default) if spec.type is list else spec.default
        if given is not None:
            spec.coerce(cls.NODE, given)  # a clear error before rclpy's generic type message
        node.declare_parameter(
            name, default if given is None else given, descriptor_for(spec), ignore_override=True
        )
        values[name] = node.get_parameter(name).value
    for name in sorted(
        n for n in overrides if cls.is_open(n)
    ):  # e.g. strategy.beta: read-only pass-through
        node.declare_parameter(
            name,
            node._parameter_overrides[name].value,
            ParameterDescriptor(
                name=name,
                read_only=True,
                dynamic_typing=True,
                description=f"passed to the {name.split('.')[0]} settings",
            ),
            ignore_override=True,
        )
        values[name] = node.get_parameter(name).value
    holder = [cls.from_mapping(values, **context)]

    def on_set(parameters: list[Parameter]) -> SetParametersResult:
        changes = {}
        for p in parameters:
            spec = specs.get(p.name)
            if spec is None or not spec.live:
                return SetParametersResult(
                    successful=False,
                    reason=f"{cls.NODE} parameter {p.name!r} cannot "
                    f"change while the node runs (got {p.value!r})",
                )
            changes[p.name] = p.value
        try:
            new = holder[0].replace(**changes)
        except ValueError as exc:  # names the parameter and the value
            return SetParametersResult(successful=False, reason=str(exc))
        holder[0] = new
        on_change(new)
        return SetParametersResult(
            successful=True,
            reason="applied: " + ", ".join(f"{k}={v!r}" for k, v in changes.items()),
        )

    node.add_on_set_parameters_callback(on_set)
    return holder[0]

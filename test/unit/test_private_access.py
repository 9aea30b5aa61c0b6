"""No module reads another object's underscore attributes (issue 25, item 1: explicit
collaborators).

A helper split off a node takes what it uses (a clock, a publisher, a model cache, a config) as
explicit collaborators; it never reaches into the node's private state, and no other module does
either. This scans every module of the package for ``<expr>._name`` where ``<expr>`` is not
``self``/``cls``/``super()`` (``self.other._name`` counts: it is another object's private).

The few exceptions are third-party objects with no public way to do the same, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fed_ros"

# (module path relative to fed_ros/, expression as ast.unparse writes it) -> why it is allowed.
ALLOWED: dict[tuple[str, str], str] = {
    ("ros/shutdown.py", "os._exit"): "the standard library's exit without interpreter finalization",
    (
        "ros/nodes/typed_params.py",
        "node._parameter_overrides",
    ): "rclpy keeps the --ros-args overrides only there; unknown overrides must be refused by name",
    (
        "ros/rigs/attacker.py",
        "msg._robot_id",
    ): "the attacker writes past the message's bound checks on purpose",
    (
        "ros/rigs/attacker.py",
        "msg.payload._payload_id",
    ): "the attacker writes past the bound checks on purpose",
    (
        "sim/envs.py",
        "self._sim.model._model",
    ): "robosuite's MjSim wraps the raw mujoco.MjModel there",
    ("sim/envs.py", "self._sim.data._data"): "robosuite's MjSim wraps the raw mujoco.MjData there",
    ("sim/envs.py", "self._env._check_success"): "robosuite's task success test has no public name",
    (
        "sim/scene_edit.py",
        "env.sim.model._model",
    ): "robosuite's MjSim wraps the raw mujoco.MjModel there",
    (
        "sim/scene_edit.py",
        "env.sim.data._data",
    ): "robosuite's MjSim wraps the raw mujoco.MjData there",
}


def _own(value: ast.expr) -> bool:
    """``self`` / ``cls`` / ``super()``: the object's own (or its class hierarchy's) attributes."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def private_reads(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every read of another object's underscore attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not _own(node.value)
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_sees_a_reach_into_another_objects_private_state():
    code = (
        "def f(node):\n    return node._lock\n"
        "class A:\n    def g(self):\n        return self._x, self.node._y\n"
    )
    assert private_reads(code) == [(2, "node._lock"), (5, "self.node._y")]
    assert private_reads("class B(A):\n    def h(self):\n        return super()._z, cls._w\n") == []


def test_no_module_reads_another_objects_private_attributes():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for line, expr in private_reads(path.read_text()):
            if (rel, expr) not in ALLOWED:
                offenders.append(f"fed_ros/{rel}:{line}: {expr}")
    assert not offenders, (
        "reads of another object's private attributes (take a collaborator instead):\n"
        + "\n".join(offenders)
    )


def test_every_exception_still_exists():
    """An allowance whose code is gone must be removed, so the list stays the truth."""
    present = {
        (p.relative_to(PACKAGE).as_posix(), expr)
        for p in PACKAGE.rglob("*.py")
        for _, expr in private_reads(p.read_text())
    }
    assert not set(ALLOWED) - present, sorted(set(ALLOWED) - present)

"""Every node `ros2 run fed_ros <node>` starts (scripts/) is a console script of a pip install too
(setup.py), so a user with the PyPI wheels, who has no `ros2` command, can start each one."""

from __future__ import annotations

import ast
import re
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setup_console_scripts() -> dict[str, str]:
    """name -> "module:function" of setup.py's console_scripts."""
    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.keywords)
    entry_points = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "entry_points"))
    pairs = (line.split("=") for line in entry_points["console_scripts"])
    return {name.strip(): target.strip() for name, target in pairs}


def _script_targets() -> dict[str, str]:
    """scripts/<node> -> the "module:main" it runs."""
    targets = {}
    for script in sorted((REPO / "scripts").iterdir()):
        module = re.search(r"^from (\S+) import main$", script.read_text(), re.M)
        assert module, f"{script} does not import a main"
        targets[script.name] = f"{module.group(1)}:main"
    return targets


def test_every_ros2_run_node_has_a_console_script():
    console = set(_setup_console_scripts().values())
    missing = {node: t for node, t in _script_targets().items() if t not in console}
    assert not missing, f"nodes without a console script in setup.py: {missing}"
    assert _setup_console_scripts()["fed-ros-teleop"] == "fed_ros.ros.nodes.teleop.teleop_node:main"


def test_the_installed_package_has_the_console_scripts_of_setup_py():
    """`pip install -e .` was rerun after setup.py changed (a stale install lacks new scripts)."""
    # The venv also holds the interfaces' egg-info, named fed_ros too and without entry points,
    # which shadows the pip install in metadata.entry_points(): read every fed_ros distribution.
    installed = {
        ep.name: ep.value
        for dist in metadata.distributions()
        if dist.metadata["Name"] == "fed_ros"
        for ep in dist.entry_points
        if ep.group == "console_scripts"
    }
    assert installed == _setup_console_scripts()

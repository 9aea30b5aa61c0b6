"""The package's shape: no import cycles, the layers import only downwards.

Walks every module of fed_ros with ``ast`` (no imports executed) and collects every import,
at module level and inside functions (a lazy import is still a dependency).

Layers: core (numpy/scipy) <- learning (torch) <- sim (MuJoCo) <- ros (rclpy, fed_ros.msg/srv);
bench, cli and commands (the argument parsing) sit on top. Inside ros, the test rigs
(``ros.rigs``) and the benchmarks over DDS (``ros.bench``) are tooling: no product module imports
them. The nodes read their parameter schemas from ``ros.configuration``, never from the
fleet's planning (``ros.fleet``) or the operator interfaces (``ros.operator``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fed_ros"
# Module sizes are a report in `make lint` (tools/module_sizes.py), not a failure here: a hard
# cap drove splits that followed a number instead of a concept (issue 38).
# layer -> module prefixes it must not import (directly, at any level of the file)
FORBIDDEN = {
    "fed_ros.core": (
        "torch",
        "rclpy",
        "fed_ros.learning",
        "fed_ros.sim",
        "fed_ros.ros",
        "fed_ros.bench",
        "fed_ros.msg",
        "fed_ros.srv",
        "mujoco",
        "robosuite",
        "fed_ros.cli",
        "fed_ros.commands",
    ),
    "fed_ros.learning": (
        "rclpy",
        "fed_ros.sim",
        "fed_ros.ros",
        "fed_ros.bench",
        "fed_ros.msg",
        "fed_ros.srv",
        "fed_ros.cli",
        "fed_ros.commands",
    ),
    "fed_ros.sim": (
        "rclpy",
        "fed_ros.ros",
        "fed_ros.bench",
        "fed_ros.msg",
        "fed_ros.srv",
        "fed_ros.cli",
        "fed_ros.commands",
    ),
    "fed_ros.ros.nodes": (
        "fed_ros.ros.fleet",
        "fed_ros.ros.operator",
        "fed_ros.bench",
        "fed_ros.ros.rigs",
        "fed_ros.cli",
        "fed_ros.commands",
    ),
    "fed_ros.ros.configuration": (
        "rclpy",
        "fed_ros.ros.nodes",
        "fed_ros.ros.fleet",
        "fed_ros.ros.operator",
        "fed_ros.bench",
        "fed_ros.ros.rigs",
    ),
}
ROS_ONLY = ("rclpy", "fed_ros.msg", "fed_ros.srv", "rcl_interfaces", "launch", "launch_ros")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, anywhere in the file (relative imports resolved)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def package_graph(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package's own modules it imports."""
    modules = {module_name(p, root): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in imports_of(path, root) if m in modules and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = GREY
        stack.append(m)
        for n in sorted(graph[m]):
            if color[n] == GREY:
                return stack[stack.index(n) :] + [n]
            if color[n] == WHITE:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def _ancestors_are_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # `import fed_ros.ros.nodes.x` also runs fed_ros/__init__ and fed_ros/ros/__init__; a
    # package __init__ importing its own submodule is not a cycle, so parents are not edges.
    return {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in graph.items()}


def _matches(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_no_import_cycles():
    cycle = find_cycle(_ancestors_are_packages(package_graph()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_downwards(layer):
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name == layer or name.startswith(layer + "."):
            bad += [
                f"{name} imports {m}"
                for m in sorted(imports_of(path))
                if _matches(m, FORBIDDEN[layer])
            ]
    assert not bad, "\n".join(bad)


# Inside the ROS layer (the only one that may import rclpy), what runs on a robot or a server
# and what tests and benchmarks it: the product never imports its tooling.
ROS_TOOLING = ("fed_ros.ros.rigs", "fed_ros.ros.bench")


def test_the_ros_product_never_imports_its_tooling():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if not _matches(name, ("fed_ros.ros",)) or _matches(name, ROS_TOOLING):
            continue
        tooling = (*ROS_TOOLING, "fed_ros.bench", "fed_ros.cli", "fed_ros.commands")
        bad += [f"{name} imports {m}" for m in sorted(imports_of(path)) if _matches(m, tooling)]
    assert not bad, "\n".join(bad)


def test_only_the_ros_layer_imports_rclpy_and_the_messages():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name.startswith(("fed_ros.ros", "fed_ros.msg", "fed_ros.srv")):
            continue
        bad += [f"{name} imports {m}" for m in sorted(imports_of(path)) if _matches(m, ROS_ONLY)]
    assert not bad, "\n".join(bad)


# Argument parsing is the command line's job (fed_ros/cli.py, fed_ros/commands/): the layers
# below it offer plain typed functions a command, a node or a test calls alike (issue 38).
BELOW_THE_CLI = ("fed_ros.core", "fed_ros.learning", "fed_ros.sim")


def argparse_importers(package: Path = PACKAGE, root: Path = ROOT) -> list[str]:
    """Modules under core, learning or sim that import argparse, anywhere in the file."""
    return [
        module_name(path, root)
        for path in sorted(package.rglob("*.py"))
        if _matches(module_name(path, root), BELOW_THE_CLI)
        and _matches_any_import(imports_of(path, root), ("argparse",))
    ]


def _matches_any_import(found: set[str], prefixes: tuple[str, ...]) -> bool:
    return any(_matches(m, prefixes) for m in found)


def test_no_argparse_below_the_cli_layer():
    assert argparse_importers() == []


def test_module_size_report_names_long_modules_and_fat_nodes(tmp_path):
    """`make lint`'s size report (tools/module_sizes.py) replaces the old hard cap: it lists a
    module over 500 lines and a node executable over 300, and nothing else."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import module_sizes
    finally:
        sys.path.pop(0)
    pkg = tmp_path / "pkg"
    (pkg / "nodes").mkdir(parents=True)
    (pkg / "long.py").write_text("x = 1\n" * 501)
    (pkg / "ok.py").write_text("x = 1\n" * 500)
    (pkg / "nodes" / "fat_node.py").write_text("x = 1\n" * 301)
    (pkg / "nodes" / "thin_node.py").write_text("x = 1\n" * 300)
    report = module_sizes.over_report(module_sizes.module_sizes(pkg))
    assert [line.split(":")[0] for line in report] == ["pkg.long", "pkg.nodes.fat_node"], report
    assert module_sizes.main([str(pkg)]) == 0  # a report, never a failure


def test_the_checks_see_a_cycle_and_a_function_level_import(tmp_path):
    """The walker itself: a lazy import inside a function closes a cycle it must report."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    import torch\n")
    graph = package_graph(pkg, tmp_path)
    assert find_cycle(_ancestors_are_packages(graph)) in (
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.b", "pkg.a", "pkg.b"],
    )
    assert "torch" in imports_of(pkg / "b.py", tmp_path)

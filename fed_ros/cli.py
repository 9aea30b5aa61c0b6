"""`fed-ros` command line: one entry point, subcommands implemented in their own modules.

Subcommand modules are imported lazily so `fed-ros keys` never pays for torch or MuJoCo.
Each target is ``module:function`` taking ``argv: list[str]`` and returning an exit code.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "fed_ros.ros.fleet.cli:demo_main",
        "run the simulated fleet demo (what `make demo` runs)",
    ),
    "up": ("fed_ros.ros.fleet.cli:up_main", "start a fleet from a fleet config as processes"),
    "status": (
        "fed_ros.ros.fleet.cli:status_main",
        "show the live fleet: robots, clusters, round, metrics",
    ),
    "robot": (
        "fed_ros.ros.operator.robot_cli:main",
        "operate one robot: reset, record, learning on/off, evaluate, estop",
    ),
    "plan": ("fed_ros.ros.fleet.cli:plan_main", "print the nodes a fleet config starts"),
    "keys": (
        "fed_ros.commands.keys:keys_main",
        "create robot / server Ed25519 key pairs and allow-lists",
    ),
    "dataset": (
        "fed_ros.ros.arm.dataset_cli:main",
        "export demonstrations as a LeRobot dataset, or import one",
    ),
    "partition": (
        "fed_ros.commands.partition:main",
        "partition a recorded demonstration set across robots",
    ),
}

BENCHES: dict[str, tuple[str, str]] = {
    "aggregate": (
        "fed_ros.bench.aggregate:main",
        "server aggregation vs memory-bandwidth and SVD bounds",
    ),
    "train": ("fed_ros.bench.train:main", "local training steps/s, BC-only vs FedDRMan losses"),
    "sim": ("fed_ros.bench.sim:main", "raw env steps/s vs bridge steps/s, demos per hour"),
    "transfer": (
        "fed_ros.ros.bench.transfer:main",
        "model transfer: ROS 2 default / tuned / zmq / memcpy",
    ),
    "federation": (
        "fed_ros.bench.federation.command:main",
        "the papers' claims on MuJoCo arms, tables and plots",
    ),
    "async": (
        "fed_ros.bench.federation.asynchronous:main",
        "synchronous vs buffered asynchronous rounds, one robot slower",
    ),
    "robustness": (
        "fed_ros.bench.robustness:main",
        "attack table with and without robust aggregation",
    ),
    "discovery": (
        "fed_ros.ros.bench.discovery:main",
        "DDS discovery time and traffic for N robots, simple vs Discovery Server",
    ),
    "fleet-scale": (
        "fed_ros.ros.bench.fleet_scale:main",
        "the real server node against N virtual robots: cost growth, faults",
    ),
}


def _usage() -> str:
    lines = ["usage: fed-ros <command> [args]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["  bench <name> run a benchmark:"]
    lines += [f"    {name:<10} {help_}" for name, (_, help_) in BENCHES.items()]
    return "\n".join(lines)


def _call(target: str, argv: list[str]) -> int:
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `fed-ros <command> ...`; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        if not rest or rest[0] not in BENCHES:
            print(_usage(), file=sys.stderr)
            print(
                f"\nfed-ros bench: unknown benchmark {rest[0]!r}" if rest else "", file=sys.stderr
            )
            return 2
        return _call(BENCHES[rest[0]][0], rest[1:])
    if command not in COMMANDS:
        print(_usage(), file=sys.stderr)
        print(f"\nfed-ros: unknown command {command!r}", file=sys.stderr)
        return 2
    return _call(COMMANDS[command][0], rest)


if __name__ == "__main__":
    sys.exit(main())

"""Run a fleet plan as processes: one process per node of :func:`fed_ros.ros.fleet.plan.plan_fleet`.

`fed-ros up` and `fed-ros demo` use it: each node gets its parameters in a ROS 2 params file,
the fleet an isolated ROS domain, every node its own log. Ctrl-C shuts the nodes down in
order (:data:`STOP_ORDER`): whatever commands an arm first (robot nodes, expert drivers, the
server), then the arm adapters, which send the arm its last zero command, then the simulated
arms; each group gets SIGINT, then SIGKILL after a grace period. A fleet with
`discovery: {server: start}` starts its Discovery Server before the nodes and stops it last.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import yaml

from fed_ros.ros.fleet.discovery import SERVER_EXECUTABLE, check_listen_address, find_executable
from fed_ros.ros.fleet.plan import (
    EXECUTABLE_ENTRY_POINTS,
    FleetConfig,
    NodeSpec,
    ProcessSpec,
    fleet_setup,
    plan_fleet,
)

STATE_FILE = "fleet.json"
# Shutdown order, by executable: the policy side first, the arm adapter (the last to command
# the arm: its zero follows every policy command) after it, the simulated arm last (it must still
# be there to receive that zero). The Discovery Server goes last: nodes still running keep
# finding each other through it. Executables not listed stop with the first group.
STOP_ORDER: tuple[tuple[str, ...], ...] = (
    ("robot_node", "expert_driver_node", "server_node"),
    ("arm_adapter_node",),
    ("sim_bridge_node",),
    (SERVER_EXECUTABLE,),
)


@dataclass(frozen=True)
class NodeCommand:
    """A planned node and the command line that runs it."""

    spec: NodeSpec | ProcessSpec
    argv: list[str]
    log_path: Path


def _log_name(spec: NodeSpec | ProcessSpec) -> str:
    return spec.fqn.strip("/").replace("/", "__")


def build_commands(plan: Sequence[NodeSpec], run_dir: str | Path) -> list[NodeCommand]:
    """Command lines (and params files, written under run_dir/params) for every planned node."""
    run_dir = Path(run_dir)
    (run_dir / "params").mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    commands = []
    for spec in plan:
        target = EXECUTABLE_ENTRY_POINTS.get(spec.executable)
        if target is None:
            raise ValueError(f"node {spec.fqn}: no entry point for executable {spec.executable!r}")
        module, func = target.split(":")
        params_path = run_dir / "params" / f"{_log_name(spec)}.yaml"
        params_path.write_text(yaml.safe_dump(spec.params_yaml(), sort_keys=False))
        argv = [
            sys.executable,
            "-c",
            f"import sys; from {module} import {func}; sys.exit({func}())",
            "--ros-args",
            "-r",
            f"__node:={spec.name}",
            "-r",
            f"__ns:={spec.namespace}",
            "--params-file",
            str(params_path),
        ]
        for src, dst in spec.remappings:
            argv += ["-r", f"{src}:={dst}"]
        commands.append(NodeCommand(spec, argv, run_dir / "logs" / f"{_log_name(spec)}.log"))
    return commands


def build_process_commands(
    processes: Sequence[ProcessSpec], run_dir: str | Path
) -> list[NodeCommand]:
    """Command lines of the fleet's processes that are not nodes (its Discovery Server)."""
    for process in processes:
        if process.listen_address:
            check_listen_address(process.listen_address)
    (Path(run_dir) / "logs").mkdir(parents=True, exist_ok=True)
    return [
        NodeCommand(
            p,
            [find_executable(p.executable), *p.arguments],
            Path(run_dir) / "logs" / f"{p.name}.log",
        )
        for p in processes
    ]


def fleet_env(
    domain_id: int | None = None,
    discovery_range: str = "LOCALHOST",
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for fleet processes: its own ROS domain, discovery range, unbuffered logs."""
    env = dict(os.environ if base is None else base)
    if domain_id is not None:
        if not 0 <= domain_id <= 232:
            raise ValueError(f"ROS_DOMAIN_ID must be in [0, 232], got {domain_id}")
        env["ROS_DOMAIN_ID"] = str(domain_id)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = discovery_range
    env.pop("ROS_LOCALHOST_ONLY", None)  # ignored by Kilted; the range above is what counts
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MUJOCO_GL", "egl")
    env.setdefault("PYOPENGL_PLATFORM", "egl")
    repo = str(Path(__file__).resolve().parents[3])
    if repo not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return env


def _default_spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    out = open(log_path, "ab")
    try:
        # Own session: Ctrl-C in the terminal reaches `fed-ros up` only, which then stops
        # each node itself (in order, with a grace period) instead of all at once.
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    finally:
        out.close()


class FleetProcesses:
    """The running processes of a plan: start, watch for deaths, stop cleanly."""

    def __init__(
        self,
        commands: Sequence[NodeCommand],
        env: dict[str, str],
        spawn: Callable[..., subprocess.Popen] | None = None,
    ) -> None:
        self.commands = list(commands)
        self.env = env
        self.spawn = spawn or (lambda argv, env, log_path: _default_spawn(argv, env, log_path))
        self.procs: dict[str, subprocess.Popen] = {}
        self.progress = LogFollower(self.commands)  # progress lines of the node logs

    def start(self, fqns: Sequence[str] | None = None) -> None:
        """Start every node (or the named ones, e.g. to restart one)."""
        for cmd in self.commands:
            if fqns is not None and cmd.spec.fqn not in fqns:
                continue
            self.procs[cmd.spec.fqn] = self.spawn(cmd.argv, env=self.env, log_path=cmd.log_path)

    def dead(self) -> list[tuple[str, int]]:
        """Nodes that have exited, with their exit codes."""
        return [(fqn, p.returncode) for fqn, p in self.procs.items() if p.poll() is not None]

    def kill(self, fqn: str, sig: int = signal.SIGKILL) -> None:
        """Send a signal to one node's process group (fault injection, restarts)."""
        proc = self.procs[fqn]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def stop_groups(self) -> list[list[str]]:
        """The started nodes in shutdown order (:data:`STOP_ORDER`), one list per group."""
        executables = {c.spec.fqn: c.spec.executable for c in self.commands}
        later = {exe: i for i, group in enumerate(STOP_ORDER) for exe in group}
        groups: list[list[str]] = [[] for _ in STOP_ORDER]
        for fqn in self.procs:
            groups[later.get(executables.get(fqn, ""), 0)].append(fqn)
        return [g for g in groups if g]

    def stop(self, grace_s: float = 10.0) -> dict[str, int]:
        """Stop the nodes group by group (:meth:`stop_groups`): SIGINT, then SIGKILL what is still
        running after ``grace_s``; exit codes."""
        for group in self.stop_groups():
            procs = [self.procs[fqn] for fqn in group]
            for proc in procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGINT)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + grace_s
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait(timeout=5)
        return {fqn: p.returncode for fqn, p in self.procs.items()}

    @property
    def pids(self) -> dict[str, int]:
        """Process id of each started node."""
        return {fqn: p.pid for fqn, p in self.procs.items()}


# Node log lines worth showing while a fleet runs (`fed-ros up`, `fed-ros demo`): demonstrations,
# registration, training, evaluation, rounds. Each node writes one line per event, so following
# the log files costs a read per poll and needs no extra topic.
PROGRESS_LINE = re.compile(
    r"recording \d+ demonstration|demonstration \d+ \(|recorded \d+/\d+ successful|registered with "
    r"the fleet|: training, step|: trained \d+ steps|: evaluated|announced round \d+ "
    r"stage|federation finished|^\[(?:ERROR|FATAL)\]"
)


class LogFollower:
    """Follows the fleet's node logs and returns their new progress lines (``node: message``)."""

    def __init__(
        self, commands: Sequence[NodeCommand], pattern: re.Pattern = PROGRESS_LINE
    ) -> None:
        self.paths = {c.spec.fqn: c.log_path for c in commands}
        # Logs are appended to: start after what an earlier run in the same run_dir wrote.
        self.offsets = {
            fqn: path.stat().st_size if path.is_file() else 0 for fqn, path in self.paths.items()
        }
        self.partial = {fqn: b"" for fqn in self.paths}
        self.pattern = pattern

    def poll(self) -> list[str]:
        """Progress lines written since the last call, in file order per node."""
        lines = []
        for fqn, path in self.paths.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[fqn])
                    data = f.read()
            except OSError:
                continue
            self.offsets[fqn] += len(data)
            *complete, self.partial[fqn] = (self.partial[fqn] + data).split(b"\n")
            for raw in complete:
                line = raw.decode("utf-8", "replace").rstrip()
                if self.pattern.search(line):
                    # "[INFO] [1796...] [robot_0.robot]: message" -> "robot_0/robot: message"
                    level = "" if line.startswith("[INFO]") else line.split("]", 1)[0] + "] "
                    lines.append(f"{fqn.strip('/')}: {level}{line.split(']: ', 1)[-1]}")
        return lines


def start_fleet(
    config: FleetConfig,
    run_dir: Path,
    domain_id: int,
    discovery_range: str = "LOCALHOST",
    include_server: bool = True,
    robot_ids: Sequence[str] | None = None,
    spawn: Callable[..., subprocess.Popen] | None = None,
    base_env: dict[str, str] | None = None,
) -> FleetProcesses:
    """Start a fleet plan as processes and record it in run_dir/fleet.json."""
    plan = plan_fleet(config, include_server=include_server, robot_ids=robot_ids)
    setup_env, processes = fleet_setup(config, include_server=include_server)
    # The Discovery Server first: clients retry it until it answers, but each try costs them.
    commands = build_process_commands(processes, run_dir) + build_commands(plan, run_dir)
    env = fleet_env(domain_id, discovery_range, base_env)
    env.update(setup_env)
    fleet = FleetProcesses(commands, env, spawn)
    fleet.start()
    state = {
        "name": config.name,
        "domain_id": domain_id,
        "discovery_range": discovery_range,
        "discovery_server": config.discovery.endpoint,
        "started": time.time(),
        "pids": fleet.pids,
        "logs": {c.spec.fqn: str(c.log_path) for c in commands},
    }
    (run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    return fleet


def fleet_state(config: FleetConfig) -> dict:
    """What `fed-ros up` recorded for the fleet in run_dir/fleet.json ({} when nothing readable)."""
    path = Path(config.run_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}

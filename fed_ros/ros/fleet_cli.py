"""`fed-ros up | status | plan | demo`: run a fleet plan as processes and watch it.

`fed-ros up` starts exactly the nodes of :func:`fed_ros.ros.fleet_plan.plan_fleet` (what
the launch files start), each as its own process with its parameters in a ROS 2 params
file, in an isolated ROS domain with LOCALHOST discovery, one log per node. Ctrl-C shuts
every node down (SIGINT, then SIGKILL after a grace period); if a node dies the rest are
stopped and the exit code is non-zero.

rclpy is imported only by the subcommands that talk to the fleet (status, demo).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import yaml

from fed_ros.ros.fleet_plan import (EXECUTABLE_ENTRY_POINTS, FleetConfig, NodeSpec, default_fleet_file,
                                    format_plan, load_fleet_config, plan_fleet)

STATE_FILE = "fleet.json"


@dataclass(frozen=True)
class NodeCommand:
    """A planned node and the command line that runs it."""

    spec: NodeSpec
    argv: list[str]
    log_path: Path


def _log_name(spec: NodeSpec) -> str:
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
        argv = [sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())",
                "--ros-args", "-r", f"__node:={spec.name}", "-r", f"__ns:={spec.namespace}",
                "--params-file", str(params_path)]
        for src, dst in spec.remappings:
            argv += ["-r", f"{src}:={dst}"]
        commands.append(NodeCommand(spec, argv, run_dir / "logs" / f"{_log_name(spec)}.log"))
    return commands


def fleet_env(domain_id: int | None = None, discovery_range: str = "LOCALHOST",
              base: dict[str, str] | None = None) -> dict[str, str]:
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
    repo = str(Path(__file__).resolve().parents[2])
    if repo not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return env


def _default_spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    out = open(log_path, "ab")
    try:
        # Own session: Ctrl-C in the terminal reaches `fed-ros up` only, which then stops
        # each node itself (in order, with a grace period) instead of all at once.
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        out.close()


class FleetProcesses:
    """The running processes of a plan: start, watch for deaths, stop cleanly."""

    def __init__(self, commands: Sequence[NodeCommand], env: dict[str, str],
                 spawn: Callable[..., subprocess.Popen] | None = None) -> None:
        self.commands = list(commands)
        self.env = env
        self.spawn = spawn or (lambda argv, env, log_path: _default_spawn(argv, env, log_path))
        self.procs: dict[str, subprocess.Popen] = {}

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

    def stop(self, grace_s: float = 10.0) -> dict[str, int]:
        """SIGINT every node, SIGKILL what is still running after ``grace_s``; exit codes."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
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


def _fleet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fleet", nargs="?", default=None,
                        help="fleet config YAML (default: config/fleet_demo.yaml)")


def _robot_list(text: str | None) -> list[str] | None:
    return None if text is None else [r for r in text.split(",") if r]


def _load(path: str | None) -> FleetConfig:
    return load_fleet_config(path or default_fleet_file())


# --------------------------------------------------------------------------- plan

def plan_main(argv: list[str]) -> int:
    """`fed-ros plan [fleet.yaml] [--robots ids] [--no-server] [--yaml]`: print the node set."""
    parser = argparse.ArgumentParser(prog="fed-ros plan", description=plan_main.__doc__)
    _fleet_arg(parser)
    parser.add_argument("--robots", default=None, help="comma-separated robot ids (default: all)")
    parser.add_argument("--no-server", action="store_true", help="leave the server out")
    parser.add_argument("--yaml", action="store_true", help="print ROS 2 params files instead of a table")
    args = parser.parse_args(argv)
    try:
        config = _load(args.fleet)
        plan = plan_fleet(config, include_server=not args.no_server,
                          robot_ids=_robot_list(args.robots))
    except ValueError as exc:
        print(f"fed-ros plan: {exc}", file=sys.stderr)
        return 2
    if args.yaml:
        merged: dict = {}
        for spec in plan:
            merged.update(spec.params_yaml())
        print(yaml.safe_dump(merged, sort_keys=False), end="")
    else:
        print(format_plan(plan))
    return 0


# ----------------------------------------------------------------------------- up

def _up_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    _fleet_arg(parser)
    parser.add_argument("--domain-id", type=int, default=None,
                        help="ROS_DOMAIN_ID (default: a random free-looking id in 1..101)")
    parser.add_argument("--discovery-range", default="LOCALHOST", choices=("LOCALHOST", "SUBNET", "SYSTEM_DEFAULT"),
                        help="ROS_AUTOMATIC_DISCOVERY_RANGE; SUBNET for robots on other machines")
    parser.add_argument("--robots", default=None, help="comma-separated robot ids to start (default: all)")
    parser.add_argument("--no-server", action="store_true", help="do not start the server here")
    parser.add_argument("--run-dir", default=None, help="logs and params (default: the fleet's run_dir)")
    return parser


def start_fleet(config: FleetConfig, run_dir: Path, domain_id: int, discovery_range: str = "LOCALHOST",
                include_server: bool = True, robot_ids: Sequence[str] | None = None,
                spawn: Callable[..., subprocess.Popen] | None = None,
                base_env: dict[str, str] | None = None) -> FleetProcesses:
    """Start a fleet plan as processes and record it in run_dir/fleet.json."""
    plan = plan_fleet(config, include_server=include_server, robot_ids=robot_ids)
    commands = build_commands(plan, run_dir)
    env = fleet_env(domain_id, discovery_range, base_env)
    fleet = FleetProcesses(commands, env, spawn)
    fleet.start()
    state = {"name": config.name, "domain_id": domain_id, "discovery_range": discovery_range,
             "started": time.time(), "pids": fleet.pids,
             "logs": {c.spec.fqn: str(c.log_path) for c in commands}}
    (run_dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    return fleet


def _stop_on_signals(flag: list[bool]) -> None:
    def handler(signum, _frame):
        flag[0] = True
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def up_main(argv: list[str]) -> int:
    """`fed-ros up [fleet.yaml]`: start the fleet as processes until Ctrl-C or a node dies."""
    args = _up_parser("fed-ros up").parse_args(argv)
    try:
        config = _load(args.fleet)
        domain = args.domain_id if args.domain_id is not None else random.SystemRandom().randint(1, 101)
        run_dir = Path(args.run_dir or config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        stop = [False]
        _stop_on_signals(stop)
        fleet = start_fleet(config, run_dir, domain, args.discovery_range, not args.no_server,
                            _robot_list(args.robots))
    except ValueError as exc:
        print(f"fed-ros up: {exc}", file=sys.stderr)
        return 2
    print(f"fed-ros up: fleet {config.name!r}: {len(fleet.procs)} nodes, ROS_DOMAIN_ID={domain}, "
          f"logs in {run_dir / 'logs'}")
    print(f"  watch it with: fed-ros status {args.fleet or ''} --domain-id {domain}".rstrip())
    code = 0
    try:
        while not stop[0]:
            dead = fleet.dead()
            if dead:
                for fqn, rc in dead:
                    print(f"fed-ros up: node {fqn} exited with code {rc} "
                          f"(log: {run_dir / 'logs' / (fqn.strip('/').replace('/', '__') + '.log')})",
                          file=sys.stderr)
                code = 0 if all(rc == 0 for _, rc in dead) else 1
                break
            time.sleep(0.5)
    finally:
        codes = fleet.stop()
    print("fed-ros up: stopped (" + ", ".join(f"{k}={v}" for k, v in codes.items()) + ")")
    return code


# ------------------------------------------------------------------------- status

def _domain_from_run_dir(config: FleetConfig) -> int | None:
    path = Path(config.run_dir) / STATE_FILE
    if path.is_file():
        try:
            return int(json.loads(path.read_text())["domain_id"])
        except (ValueError, KeyError, TypeError):
            return None
    return None


def format_report(report: dict) -> str:
    """A round report (as a dict) as the table `status` and `demo` print."""
    lines = [f"round {report['round']} ({report['algorithm']}): {report['status']}; updates "
             f"{report['updates_accepted']}/{report['updates_received']} accepted, "
             f"{report['updates_rejected']} rejected, aggregation {report['aggregation_seconds']:.2f} s"]
    lines.append(f"  {'robot':<12} {'clusters':<10} {'samples':>8} {'train_loss':>10} {'success':>8}  note")
    for r in report["robots"]:
        success = "-" if math.isnan(r["success_rate"]) else f"{r['success_rate']:.2f}"
        loss = "-" if math.isnan(r["train_loss"]) else f"{r['train_loss']:.3f}"
        clusters = ",".join(str(c) for c in r["cluster_ids"]) or "-"
        lines.append(f"  {r['robot_id']:<12} {clusters:<10} {r['num_samples']:>8} {loss:>10} {success:>8}  "
                     f"{r['reason']}")
    for c in report["clusters"]:
        lines.append(f"  cluster {c['cluster_id']}: {', '.join(c['members'])}  |dtheta|={c['update_norm']:.4g}  "
                     f"update cosine {c['intra_similarity']:.2f}")
    return "\n".join(lines)


def status_main(argv: list[str]) -> int:
    """`fed-ros status [fleet.yaml] [--domain-id N]`: robots, clusters, round, last metrics.

    The domain is --domain-id, else the one `fed-ros up` recorded for fleet.yaml, else
    ROS_DOMAIN_ID from the environment.
    """
    parser = argparse.ArgumentParser(prog="fed-ros status", description=status_main.__doc__)
    _fleet_arg(parser)
    parser.add_argument("--domain-id", type=int, default=None, help="the fleet's ROS_DOMAIN_ID")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to listen for the fleet")
    parser.add_argument("--watch", action="store_true", help="keep printing new round reports")
    args = parser.parse_args(argv)
    domain = args.domain_id
    if domain is None and args.fleet:
        # The domain `fed-ros up` picked for this fleet (recorded in its run directory).
        try:
            domain = _domain_from_run_dir(_load(args.fleet))
        except ValueError as exc:
            print(f"fed-ros status: {exc}", file=sys.stderr)
            return 2
    if domain is not None:
        os.environ["ROS_DOMAIN_ID"] = str(domain)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    from fed_ros.ros.fleet_monitor import FleetMonitor

    with FleetMonitor() as monitor:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and (monitor.announcement is None or monitor.last_report is None):
            monitor.spin_once(0.2)
        if monitor.announcement is None and monitor.last_report is None:
            print(f"fed-ros status: no fleet server answered in ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', 0)} "
                  f"within {args.timeout:.0f} s", file=sys.stderr)
            return 1
        print(monitor.summary())
        seen = monitor.last_report["round"] if monitor.last_report else -1
        while args.watch:
            monitor.spin_once(0.5)
            if monitor.last_report and monitor.last_report["round"] != seen:
                seen = monitor.last_report["round"]
                print(format_report(monitor.last_report))
    return 0


def demo_main(argv: list[str]) -> int:
    """`fed-ros demo`: the simulated fleet demo (see fed_ros.ros.fleet_demo)."""
    from fed_ros.ros.fleet_demo import run_demo
    return run_demo(argv)

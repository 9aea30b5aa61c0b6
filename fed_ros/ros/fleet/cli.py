"""`fed-ros up | status | plan | demo`: run a fleet plan as processes and watch it.

`fed-ros up` starts exactly the nodes of :func:`fed_ros.ros.fleet.plan.plan_fleet` (what
the launch files start), each as its own process with its parameters in a ROS 2 params
file, in an isolated ROS domain with LOCALHOST discovery, one log per node. Ctrl-C shuts
every node down (SIGINT, then SIGKILL after a grace period); if a node dies the rest are
stopped and the exit code is non-zero.

rclpy is imported only by the subcommands that talk to the fleet (status, demo).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from pathlib import Path

import yaml

from fed_ros.ros.fleet.launcher import fleet_state, start_fleet
from fed_ros.ros.fleet.fleet_file import default_fleet_file, load_fleet_config
from fed_ros.ros.fleet.plan import (
    FleetConfig,
    fleet_environment,
    fleet_setup,
    format_plan,
    plan_fleet,
)


def _fleet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "fleet", nargs="?", default=None, help="fleet config YAML (default: config/fleet_demo.yaml)"
    )


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
    parser.add_argument(
        "--yaml", action="store_true", help="print ROS 2 params files instead of a table"
    )
    args = parser.parse_args(argv)
    try:
        config = _load(args.fleet)
        plan = plan_fleet(
            config, include_server=not args.no_server, robot_ids=_robot_list(args.robots)
        )
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
        # What runs besides the nodes: the fleet's Discovery Server and the nodes' environment.
        env, processes = fleet_setup(config, include_server=not args.no_server)
        for process in processes:
            print(f"{process.fqn:<22} {process.executable:<18} {' '.join(process.arguments)}")
        for key, value in env.items():
            print(f"every node: {key}={value}")
    return 0


# ----------------------------------------------------------------------------- up


def _up_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    _fleet_arg(parser)
    parser.add_argument(
        "--domain-id",
        type=int,
        default=None,
        help="ROS_DOMAIN_ID (default: a random free-looking id in 1..101)",
    )
    parser.add_argument(
        "--discovery-range",
        default="LOCALHOST",
        choices=("LOCALHOST", "SUBNET", "SYSTEM_DEFAULT"),
        help="ROS_AUTOMATIC_DISCOVERY_RANGE; SUBNET for robots on other machines",
    )
    parser.add_argument(
        "--robots", default=None, help="comma-separated robot ids to start (default: all)"
    )
    parser.add_argument("--no-server", action="store_true", help="do not start the server here")
    parser.add_argument(
        "--run-dir", default=None, help="logs and params (default: the fleet's run_dir)"
    )
    return parser


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
        domain = (
            args.domain_id if args.domain_id is not None else random.SystemRandom().randint(1, 101)
        )
        run_dir = Path(args.run_dir or config.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        stop = [False]
        _stop_on_signals(stop)
        fleet = start_fleet(
            config,
            run_dir,
            domain,
            args.discovery_range,
            not args.no_server,
            _robot_list(args.robots),
        )
    except ValueError as exc:
        print(f"fed-ros up: {exc}", file=sys.stderr)
        return 2
    print(
        f"fed-ros up: fleet {config.name!r}: {len(fleet.procs)} nodes, ROS_DOMAIN_ID={domain}, "
        f"logs in {run_dir / 'logs'}"
    )
    print(f"  watch it with: fed-ros status {args.fleet or ''} --domain-id {domain}".rstrip())
    code = 0
    try:
        while not stop[0]:
            dead = fleet.dead()
            if dead:
                for fqn, rc in dead:
                    print(
                        f"fed-ros up: node {fqn} exited with code {rc} "
                        f"(log: {run_dir / 'logs' / (fqn.strip('/').replace('/', '__') + '.log')})",
                        file=sys.stderr,
                    )
                code = 0 if all(rc == 0 for _, rc in dead) else 1
                break
            for line in fleet.progress.poll():  # demonstrations, training, rounds: see LogFollower
                print(f"  {line}", flush=True)
            time.sleep(0.5)
    finally:
        codes = fleet.stop()
    print("fed-ros up: stopped (" + ", ".join(f"{k}={v}" for k, v in codes.items()) + ")")
    return code


# ------------------------------------------------------------------------- status


def status_main(argv: list[str]) -> int:
    """`fed-ros status [fleet.yaml] [--domain-id N]`: robots, clusters, round, last metrics.

    The domain is --domain-id, else the one `fed-ros up` recorded for fleet.yaml, else
    ROS_DOMAIN_ID from the environment.
    """
    parser = argparse.ArgumentParser(prog="fed-ros status", description=status_main.__doc__)
    _fleet_arg(parser)
    parser.add_argument("--domain-id", type=int, default=None, help="the fleet's ROS_DOMAIN_ID")
    parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to listen for the fleet"
    )
    parser.add_argument("--watch", action="store_true", help="keep printing new round reports")
    parser.add_argument(
        "--web",
        nargs="?",
        type=int,
        const=8765,
        default=None,
        metavar="PORT",
        help="serve a live status page on http://HOST:PORT/ (default port 8765) until Ctrl-C",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="--web: address to bind (127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--foxglove-layout",
        metavar="OUT.json",
        help="write a Foxglove layout for the fleet file's topics (for foxglove_bridge) and exit",
    )
    parser.add_argument(
        "--camera",
        default="agentview",
        help="--web: the camera shown as each robot's thumbnail ('' for none)",
    )
    parser.add_argument(
        "--camera-topic",
        default="/{robot}/arm/{camera}/image_raw",
        help="--web: the camera topic template ({robot}, {camera})",
    )
    parser.add_argument(
        "--discovery-range",
        default=None,
        choices=DISCOVERY_RANGES,
        help="ROS_AUTOMATIC_DISCOVERY_RANGE (default: what `fed-ros up` recorded for the "
        "fleet, else the environment's, else LOCALHOST); SUBNET to reach a server "
        "on another machine",
    )
    args = parser.parse_args(argv)
    if args.foxglove_layout:
        return _write_foxglove_layout(args.fleet, args.foxglove_layout)
    domain = args.domain_id
    recorded: dict = {}
    if args.fleet:
        # The domain and discovery range `fed-ros up` used for this fleet (in its run directory).
        try:
            config = _load(args.fleet)
            recorded = fleet_state(config)
        except ValueError as exc:
            print(f"fed-ros status: {exc}", file=sys.stderr)
            return 2
        # A fleet with a Discovery Server is found only through it (ROS_DISCOVERY_SERVER); one
        # already set (e.g. another address of the same server) is kept.
        for key, value in fleet_environment(config).items():
            os.environ.setdefault(key, value)
    if domain is None and recorded.get("domain_id") is not None:
        domain = int(recorded["domain_id"])
    if domain is not None:
        os.environ["ROS_DOMAIN_ID"] = str(domain)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = status_discovery_range(
        args.discovery_range,
        recorded.get("discovery_range"),
        os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE"),
    )
    from fed_ros.ros.operator.monitor import FleetMonitor, format_report

    if args.web is not None:
        return _serve_web(args.host, args.web, args.camera, args.camera_topic)
    # Metadata only: announcement and round reports. The cluster models (latched, with a
    # deep history) are not subscribed: from a robot host over a slow link that pulled ~16 MB.
    try:
        with FleetMonitor(track_models=False) as monitor:
            deadline = time.monotonic() + args.timeout
            quiet_since, count = time.monotonic(), 0
            # Until both arrived and the latched history has drained (0.5 s without a message),
            # so the summary shows the latest round, not the first report delivered.
            while time.monotonic() < deadline:
                monitor.spin_once(0.1)
                if monitor.messages_received != count:
                    quiet_since, count = time.monotonic(), monitor.messages_received
                elif (
                    monitor.announcement is not None
                    and monitor.last_report is not None
                    and time.monotonic() - quiet_since >= 0.5
                ):
                    break
            if monitor.announcement is None and monitor.last_report is None:
                print(
                    "fed-ros status: no fleet server answered in "
                    f"ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', 0)} "
                    f"(discovery range {os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE']}) "
                    f"within {args.timeout:.0f} s",
                    file=sys.stderr,
                )
                return 1
            print(monitor.summary(), flush=True)
            seen = monitor.last_report["round"] if monitor.last_report else -1
            while args.watch:
                monitor.spin_once(0.5)
                if monitor.last_report and monitor.last_report["round"] != seen:
                    seen = monitor.last_report["round"]
                    print(format_report(monitor.last_report), flush=True)
    except KeyboardInterrupt:  # Ctrl-C ends --watch
        pass
    return 0


def _write_foxglove_layout(fleet: str | None, out: str) -> int:
    """`fed-ros status FLEET --foxglove-layout OUT.json`."""
    import json

    from fed_ros.ros.operator.foxglove_layout import foxglove_layout

    if not fleet:
        print("fed-ros status: --foxglove-layout needs the fleet file", file=sys.stderr)
        return 2
    try:
        layout = foxglove_layout(_load(fleet))
    except ValueError as exc:
        print(f"fed-ros status: {exc}", file=sys.stderr)
        return 2
    Path(out).write_text(json.dumps(layout, indent=2) + "\n")
    print(
        f"fed-ros status: Foxglove layout for {fleet} in {out} ({len(layout['configById'])} panels)"
    )
    return 0


def _serve_web(host: str, port: int, camera: str = "", camera_topic: str = "") -> int:
    """`fed-ros status --web`: the monitor spins here, the page is served from a thread."""
    from fed_ros.ros.operator.camera_thumbnails import CameraThumbnails
    from fed_ros.ros.operator.monitor import FleetMonitor
    from fed_ros.ros.operator.web_status import StatusWebServer, fleet_snapshot

    with FleetMonitor(track_models=False) as monitor:
        cameras = CameraThumbnails(monitor.node, camera, camera_topic) if camera else None
        try:
            web = StatusWebServer(
                lambda: fleet_snapshot(
                    monitor.announcement,
                    list(monitor.reports),
                    time.time(),
                    cameras.data_urls() if cameras else None,
                    monitor.history.series(),
                ),
                host,
                port,
                camera_frame=cameras.large_png if cameras else None,
            ).start()
        except OSError as exc:  # e.g. the port is taken
            print(f"fed-ros status: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
            return 2
        print(f"fed-ros status: live fleet view at {web.url} (Ctrl-C stops)", flush=True)
        try:
            while True:
                monitor.spin_once(0.2)
                if cameras is not None:
                    cameras.watch(monitor.robot_ids())
        except KeyboardInterrupt:
            pass
        finally:
            web.close()
    return 0


DISCOVERY_RANGES = ("LOCALHOST", "SUBNET", "SYSTEM_DEFAULT", "OFF")


def status_discovery_range(
    option: str | None, recorded: str | None, environment: str | None
) -> str:
    """Discovery range for `fed-ros status`: the option, else the fleet's recorded one, else the
    environment's, else LOCALHOST."""
    for value in (option, recorded, environment):
        if value:
            return value
    return "LOCALHOST"


def demo_main(argv: list[str]) -> int:
    """`fed-ros demo`: the simulated fleet demo (see fed_ros.ros.fleet.demo)."""
    from fed_ros.ros.fleet.demo import run_demo

    return run_demo(argv)

"""`fed-ros bench discovery`: DDS discovery time and traffic, simple vs a Fast DDS Discovery Server.

N robot participants and one server participant (fed_ros.ros.bench.discovery_worker: the
fleet's star of topics) on separate hosts: network namespaces on one bridge
(fed_ros/ros/rigs/netns.py), the server on its own host and the robots spread over
``--hosts`` robot hosts, several participants per process so that N = 80 fits on 2 cores. Per N
and mode it measures:

- the time until every participant matched what it expects (each robot the server, the server
  every robot), from the launch of the processes and from the last participant's creation;
- the bytes every host's interfaces received (lo and eth0, summed) until then, and per second
  over ``--steady-s`` once ``--settle-s`` passed after it (the periodic announcements), and the
  server host's share;
- the machine's load average (this is a shared 2-core machine: the timings move with it).

Modes: ``simple`` (multicast SPDP, the DDS default), ``server`` (every participant a client of
a fast-discovery-server on the server host, started as `discovery: {server: start}` starts it),
and the same two with multicast dropped by the bridge (``*-nomc``: Wi-Fi, clouds); ``simple-nomc``
runs at the smallest N only, with a short timeout (it is expected never to match).
Every participant uses UDPv4 only: participants sharing a host would otherwise talk over shared
memory, which no interface counter sees. Needs root and ``ip netns`` (as
test/slow/test_multihost.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fed_ros.ros.fleet.discovery import DiscoveryConfig, find_executable
from fed_ros.ros.rigs.domains import exclusive_domain_id
from fed_ros.ros.rigs.netns import Network, unavailable_reason

MODES = ("simple", "server", "server-nomc", "simple-nomc")
WORKER = [sys.executable, "-m", "fed_ros.ros.bench.discovery_worker"]


@dataclass
class DiscoveryRun:
    """One measurement: N robots, a mode, what matched, how long, how many bytes."""

    robots: int
    mode: str
    created: int  # participants created before the timeout (of robots + 1)
    matched: int  # participants that matched everything they expect (of robots + 1)
    launch_to_matched_s: float | None  # from starting the processes to the last match
    created_to_matched_s: float | None  # from the last participant's creation to the last match
    bytes_to_matched: int  # received by every host, launch -> last match (or the timeout)
    steady_bytes_per_s: float  # received by every host per second after matching
    server_host_steady_bytes_per_s: float  # of which the server host (and its discovery server)
    load_average: float  # 1-min load average of the machine at the end of the run


class _Worker:
    """A worker process and its participants' records, read on a thread (its pipe never fills)."""

    def __init__(self, argv: list[str], env: dict[str, str], count: int) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        self.count = count
        self.created: dict[str, float] = {}
        self.matched: dict[str, float] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                record = json.loads(line)
                if "created" in record:
                    self.created[record["name"]] = record["created"]
                if "matched" in record:
                    self.matched[record["name"]] = record["matched"]

    @property
    def done(self) -> bool:
        """Every participant of this worker matched."""
        return len(self.matched) == self.count

    def stop(self) -> None:
        """SIGINT, then SIGKILL after 10 s; always reaped."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(timeout=5)


def _received(net: Network) -> dict[str, int]:
    return {name: sum(rx for rx, _ in net.counters(name).values()) for name in net.hosts}


def run_once(
    robots: int,
    mode: str,
    *,
    hosts: int = 4,
    per_process: int = 10,
    timeout_s: float = 60.0,
    settle_s: float = 10.0,
    steady_s: float = 10.0,
    port: int = 11811,
) -> DiscoveryRun:
    """Start one server and ``robots`` robot participants on separate hosts; measure discovery."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    robot_hosts = [f"robots_{h}" for h in range(hosts)]
    with exclusive_domain_id() as domain, Network(["server", *robot_hosts]) as net:
        if mode.endswith("-nomc"):
            net.block_multicast()
        env = dict(os.environ)
        for key in ("ROS_LOCALHOST_ONLY", "FASTDDS_DEFAULT_PROFILES_FILE", "ROS_DISCOVERY_SERVER"):
            env.pop(key, None)
        env.update(
            ROS_DOMAIN_ID=str(domain),
            ROS_AUTOMATIC_DISCOVERY_RANGE="SUBNET",
            FASTDDS_BUILTIN_TRANSPORTS="UDPv4",
            PYTHONPATH=os.pathsep.join(
                p for p in (str(Path(__file__).resolve().parents[3]), env.get("PYTHONPATH")) if p
            ),
        )
        workers: list[_Worker] = []
        server: subprocess.Popen | None = None
        try:
            before = _received(net)
            if mode.startswith("server"):
                discovery = DiscoveryConfig("start", net.hosts["server"].address, port)
                env.update(discovery.environment())
                argv = [find_executable(), *discovery.server_arguments()]
                server = subprocess.Popen(
                    net.command("server", argv),
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            deadline = timeout_s + settle_s + steady_s + 30
            launched = time.time()
            server_argv = ["--role", "server", "--expect", str(robots)]
            server_argv += ["--deadline-s", str(deadline)]
            workers.append(_Worker(net.command("server", WORKER + server_argv), env, 1))
            for i, first in enumerate(range(0, robots, per_process)):
                count = min(per_process, robots - first)
                argv = WORKER + [
                    "--role",
                    "robot",
                    "--first",
                    str(first),
                    "--count",
                    str(count),
                    "--expect",
                    "1",
                    "--deadline-s",
                    str(deadline),
                ]
                workers.append(_Worker(net.command(robot_hosts[i % hosts], argv), env, count))
            end = time.monotonic() + timeout_s
            while time.monotonic() < end and not all(w.done for w in workers):
                if any(w.proc.poll() is not None and not w.done for w in workers):
                    break  # a worker died before all its participants matched
                time.sleep(0.1)
            at_match = _received(net)
            waited_until = time.time()  # matches after this (while measuring) do not count
            # Discovery goes on after the star matched (the graph topic every ROS participant
            # shares): the steady rate is taken after a settling period.
            time.sleep(settle_s)
            settled = _received(net)
            time.sleep(steady_s)
            after = _received(net)
        finally:
            for w in workers:
                w.stop()
            if server is not None:
                server.send_signal(2)
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
    created = [t for w in workers for t in w.created.values()]
    matched = [t for w in workers for t in w.matched.values() if t <= waited_until]
    last_match = max(matched) if len(matched) == robots + 1 else None
    return DiscoveryRun(
        robots=robots,
        mode=mode,
        created=len(created),
        matched=len(matched),
        launch_to_matched_s=None if last_match is None else last_match - launched,
        created_to_matched_s=None if last_match is None else last_match - max(created),
        bytes_to_matched=sum(at_match.values()) - sum(before.values()),
        steady_bytes_per_s=(sum(after.values()) - sum(settled.values())) / steady_s,
        server_host_steady_bytes_per_s=(after["server"] - settled["server"]) / steady_s,
        load_average=os.getloadavg()[0],
    )


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(runs: list[DiscoveryRun]) -> str:
    """Per N, each mode's numbers side by side."""
    lines = [
        f"{'robots':>6} {'mode':<12} {'matched':>9} {'launch->all s':>13} "
        f"{'created->all s':>14} {'kB to match':>11} {'kB/s after':>10} {'server host kB/s':>16} "
        f"{'load':>5}"
    ]
    for r in sorted(runs, key=lambda r: (r.robots, MODES.index(r.mode))):
        lines.append(
            f"{r.robots:>6} {r.mode:<12} {f'{r.matched}/{r.robots + 1}':>9} "
            f"{_cell(r.launch_to_matched_s, '.2f'):>13} {_cell(r.created_to_matched_s, '.2f'):>14} "
            f"{r.bytes_to_matched / 1e3:>11.1f} {r.steady_bytes_per_s / 1e3:>10.1f} "
            f"{r.server_host_steady_bytes_per_s / 1e3:>16.1f} {r.load_average:>5.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the sizes x modes, print the table, optionally write the runs as JSON."""
    parser = argparse.ArgumentParser(prog="fed-ros bench discovery", description=__doc__)
    parser.add_argument("--robots", type=int, nargs="+", default=[10, 20, 40, 80])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--hosts", type=int, default=4, help="robot hosts (namespaces)")
    parser.add_argument("--per-process", type=int, default=10, help="participants per process")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--settle-s", type=float, default=10.0, help="after matching, before")
    parser.add_argument("--steady-s", type=float, default=10.0, help="window of 'kB/s after'")
    parser.add_argument("--nomc-timeout-s", type=float, default=15.0, help="simple-nomc's wait")
    parser.add_argument("--out", default="", help="write the runs to this JSON file")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        print(f"fed-ros bench discovery: {reason}", file=sys.stderr)
        return 2
    if min(args.robots) < 1 or args.hosts < 1 or args.per_process < 1:
        parser.error("--robots, --hosts and --per-process must be >= 1")
    runs: list[DiscoveryRun] = []
    for robots in sorted(args.robots):
        for mode in args.modes:
            if mode == "simple-nomc" and robots != min(args.robots):
                continue
            run = run_once(
                robots,
                mode,
                hosts=args.hosts,
                per_process=args.per_process,
                timeout_s=args.nomc_timeout_s if mode == "simple-nomc" else args.timeout_s,
                settle_s=args.settle_s,
                steady_s=args.steady_s,
            )
            runs.append(run)
            print(format_table([run]).splitlines()[-1], flush=True)
    print()
    print(format_table(runs))
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(r) for r in runs], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Discovery at fleet scale: the fleet file's `discovery:` option, the Discovery Server that
`fed-ros up` starts with it, and discovery across network namespaces without multicast."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import wait_until
from fed_ros.ros.bench import discovery as bench
from fed_ros.ros.fleet import launcher
from fed_ros.ros.rigs import netns
from fed_ros.ros.fleet.cli import plan_main
from fed_ros.ros.fleet.discovery import DISCOVERY_SERVER_ENV, find_executable
from fed_ros.ros.fleet.fleet_file import fleet_config_from_dict
from fed_ros.ros.fleet.plan import DISCOVERY_SERVER_NAME, fleet_setup, plan_fleet
from support.fleets import fleet_config, fleet_data

REPO = Path(__file__).resolve().parents[2]
FED_ROS = str(Path(sys.executable).parent / "fed-ros")


def _fleet(discovery=None, **overrides):
    return fleet_config(**({} if discovery is None else {"discovery": discovery}), **overrides)


def _load_launch(name: str):
    spec = importlib.util.spec_from_file_location(name.replace(".", "_"), REPO / "launch" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_start_runs_a_server_on_the_server_host_and_points_every_node_at_it():
    config = _fleet({"server": "start", "address": "10.1.2.3", "port": 12000})

    env, processes = fleet_setup(config)
    robot_env, robot_processes = fleet_setup(config, include_server=False)

    assert env == robot_env == {DISCOVERY_SERVER_ENV: "10.1.2.3:12000"}
    assert [(p.name, p.arguments) for p in processes] == [
        (DISCOVERY_SERVER_NAME, ("42", "-l", "10.1.2.3", "-p", "12000"))
    ]
    assert robot_processes == []


def test_an_existing_server_is_only_named():
    env, processes = fleet_setup(_fleet({"server": "ds.lab:11888"}))

    assert env == {DISCOVERY_SERVER_ENV: "ds.lab:11888"}
    assert processes == []


def test_without_the_option_discovery_stays_simple():
    assert fleet_setup(_fleet()) == ({}, [])
    assert fleet_setup(_fleet({"server": "simple"})) == ({}, [])


@pytest.mark.parametrize(
    "discovery, match",
    [
        ("start", "'discovery' must be a mapping, got 'start'"),
        ({"server": "begin:x"}, "'host:port', got 'begin:x'"),
        ({"server": 11811}, "got 11811"),
        ({"server": "start", "address": "ds.lab"}, "IPv4 address .* got 'ds.lab'"),
        ({"server": "start", "port": 70000}, r"\[1, 65535\], got 70000"),
        ({"server": "start", "port": "11811"}, "integer, got '11811'"),
        ({"server": "10.0.0.1:11811", "port": 11812}, "not both"),
        ({"server": "10.0.0.1", "address": "10.0.0.2"}, "got address '10.0.0.2'"),
        ({"server": "simple", "port": 11811}, "need 'server: start'"),
        ({"server": "start", "prot": 1}, r"unknown key\(s\) \['prot'\]"),
    ],
)
def test_bad_discovery_values_name_the_value(discovery, match):
    with pytest.raises(ValueError, match=match):
        _fleet(discovery)


def test_launch_files_get_the_same_setup_as_up(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    data = fleet_data(discovery={"server": "start", "address": "10.1.2.3"})
    fleet.write_text(yaml.safe_dump({"fleet": data}))
    config = fleet_config_from_dict({"fleet": data})

    whole = _load_launch("sim_fleet.launch.py").plan_setup(str(fleet))
    server = _load_launch("server.launch.py").plan_setup(str(fleet))
    robot = _load_launch("robot.launch.py").plan_setup(str(fleet), "robot_0")

    assert whole == server == fleet_setup(config)
    assert robot == fleet_setup(config, include_server=False)
    assert robot[0] == {DISCOVERY_SERVER_ENV: "10.1.2.3:11811"} and robot[1] == []


def test_launch_description_starts_the_server_and_sets_the_variable_before_the_nodes(tmp_path):
    pytest.importorskip(
        "launch_ros",
        reason="launch_ros is not installed (make test installs it from "
        "../shared/tools/ros2-launch when that folder exists)",
    )
    from launch import LaunchContext
    from launch.actions import ExecuteProcess, SetEnvironmentVariable
    from launch.utilities import perform_substitutions
    from launch_ros.actions import Node

    fleet = tmp_path / "fleet.yaml"
    data = {"name": "t", "algorithm": "fedavg", "rounds": 1, "robots": [{"task": "lift"}]}
    data["discovery"] = {"server": "start", "port": 12000}
    fleet.write_text(yaml.safe_dump({"fleet": data}))
    context = LaunchContext()
    context.launch_configurations["fleet"] = str(fleet)

    actions = []
    for entity in _load_launch("sim_fleet.launch.py").generate_launch_description().entities:
        actions += entity.visit(context) or []
    # launch_ros's Node is an ExecuteProcess too: ask for it first.
    kinds = [
        "node"
        if isinstance(a, Node)
        else "process"
        if isinstance(a, ExecuteProcess)
        else "env"
        if isinstance(a, SetEnvironmentVariable)
        else "other"
        for a in actions
    ]
    server = actions[kinds.index("process")]
    for action in actions:
        if isinstance(action, SetEnvironmentVariable):
            action.visit(context)

    assert [k for k in kinds if k != "other"] == ["env", "process", "node", "node", "node"]
    assert [perform_substitutions(context, part) for part in server.cmd] == [
        find_executable(),
        "42",
        "-l",
        "127.0.0.1",
        "-p",
        "12000",
    ]
    assert context.environment[DISCOVERY_SERVER_ENV] == "127.0.0.1:12000"


def test_plan_prints_the_discovery_server_and_the_nodes_environment(tmp_path, capsys):
    fleet = tmp_path / "fleet.yaml"
    data = {"name": "t", "algorithm": "fedavg", "rounds": 1, "robots": [{"task": "lift"}]}
    data["discovery"] = {"server": "start", "address": "10.1.2.3"}
    fleet.write_text(yaml.safe_dump({"fleet": data}))

    assert plan_main([str(fleet)]) == 0
    whole = capsys.readouterr().out
    assert plan_main([str(fleet), "--no-server"]) == 0
    robots_only = capsys.readouterr().out

    assert "/discovery_server" in whole and "42 -l 10.1.2.3 -p 11811" in whole
    assert "/discovery_server" not in robots_only
    assert "every node: ROS_DISCOVERY_SERVER=10.1.2.3:11811" in robots_only


def test_launcher_starts_the_server_first_and_stops_it_last(tmp_path):
    config = _fleet({"server": "start"})
    processes = fleet_setup(config)[1]
    commands = launcher.build_process_commands(processes, tmp_path) + launcher.build_commands(
        plan_fleet(config), tmp_path
    )

    fleet = launcher.FleetProcesses(commands, {})
    fleet.procs = {c.spec.fqn: None for c in commands}  # names only: stop_groups orders them

    assert commands[0].argv[0] == find_executable()
    assert fleet.stop_groups()[-1] == [f"/{DISCOVERY_SERVER_NAME}"]


def test_a_server_address_this_host_does_not_have_is_refused_before_anything_starts(tmp_path):
    # fast-discovery-server itself says it runs on such an address, reachable by nobody.
    processes = fleet_setup(_fleet({"server": "start", "address": "192.0.2.1"}))[1]

    with pytest.raises(ValueError, match="'192.0.2.1' is not an address of this host"):
        launcher.build_process_commands(processes, tmp_path)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROBE = """
import sys, time
import rclpy
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("discovery_probe")
# A discovery server tells a client only of endpoints that match its own: subscribe to one.
node.create_subscription(String, "/fleet/update_resend", lambda _m: None, 10)
deadline = time.monotonic() + float(sys.argv[1])
while node.count_publishers("/fleet/update_resend") < 1 and time.monotonic() < deadline:
    time.sleep(0.1)
print("found" if node.count_publishers("/fleet/update_resend") else "not found", flush=True)
"""


def test_up_starts_the_discovery_server_and_its_nodes_use_it(tmp_path, ros_env, ros_domain_id):
    port = _free_udp_port()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "fleet": {
                    "name": "t",
                    "algorithm": "fedavg",
                    "rounds": 1,
                    "robots": [{"task": "lift"}],
                    "discovery": {"server": "start", "port": port},
                }
            }
        )
    )
    run_dir = tmp_path / "run"
    argv = [FED_ROS, "up", str(fleet), "--robots", "", "--domain-id", str(ros_domain_id)]
    up = subprocess.Popen(
        argv + ["--run-dir", str(run_dir)],
        env=ros_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        state = wait_until(
            lambda: (
                json.loads((run_dir / "fleet.json").read_text())
                if (run_dir / "fleet.json").is_file()
                else None
            ),
            timeout=60,
            what="fleet.json",
        )
        endpoint = f"127.0.0.1:{port}"
        assert state["discovery_server"] == endpoint
        server_pid = state["pids"]["/fleet/server"]
        environ = Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0")
        assert f"{DISCOVERY_SERVER_ENV}={endpoint}".encode() in environ
        assert state["pids"][f"/{DISCOVERY_SERVER_NAME}"]

        # A client of the fleet's Discovery Server finds the server node's announcements.
        probe_env = dict(ros_env, **{DISCOVERY_SERVER_ENV: endpoint})
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, "60"],
            env=probe_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert probe.stdout.strip() == "found", probe.stdout + probe.stderr
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0, out
    assert "discovery_server=0" in out  # stopped by SIGINT, last, like every node


needs_netns = pytest.mark.skipif(
    bool(netns.unavailable_reason()), reason=netns.unavailable_reason() or "n/a"
)
ROBOTS = ("robot_0", "robot_1")


def _fleet_without_multicast(tmp: Path, server_address: str) -> Path:
    """docs/fleet.md's fleet across machines, plus `discovery: {server: start}` on the server."""
    from fed_ros.learning.dataset import synthetic_episodes

    run_dir = tmp / "fleet"
    for i, rid in enumerate(ROBOTS):
        demos = run_dir / rid / "demos"
        demos.mkdir(parents=True)
        for k, episode in enumerate(synthetic_episodes(2, length=20, seed=i, shift=2.0 * i)):
            episode.save(demos / f"demo_{k}.npz")
    fleet = {
        "name": "nomulticast",
        "algorithm": "fedavg",
        "rounds": 1,
        "run_dir": str(run_dir),
        "strategy": {"local_steps": 5, "lr": 1e-3},
        "server": {"round_timeout_s": 150.0, "exit_when_done": True},
        "robot_defaults": {
            "device": "cpu",
            "torch_threads": 1,
            "trainer.val_fraction": 0.0,
            "register_timeout_s": 180.0,
        },
        "robots": [{"id": rid, "task": "lift", "sim": False} for rid in ROBOTS],
        "discovery": {"server": "start", "address": server_address},
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump({"fleet": fleet}, sort_keys=False))
    return path


@needs_netns
@pytest.mark.timeout(480)
def test_a_fleet_without_multicast_runs_its_round_through_its_discovery_server(
    tmp_path, ros_domain_id
):
    from support.fleet_hosts import host_env, node_log, stop_hosts, tail, up_argv

    with netns.Network(["server", *ROBOTS]) as net:
        net.block_multicast()
        fleet = _fleet_without_multicast(tmp_path, net.hosts["server"].address)
        ups: dict[str, subprocess.Popen] = {}
        diag = lambda: "\n".join(tail(node_log(tmp_path, h)) for h in ("server", *ROBOTS))  # noqa: E731
        try:
            for host in ("server", *ROBOTS):  # docs/fleet.md's command on each machine
                run_dir = tmp_path / "hosts" / host
                run_dir.mkdir(parents=True)
                ups[host] = subprocess.Popen(
                    net.command(host, up_argv(fleet, host, ros_domain_id, run_dir)),
                    env=host_env(net.hosts[host].address),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            wait_until(
                lambda: ups["server"].poll() is not None,
                400,
                "the server to finish its round",
                interval=0.5,
                diagnostics=diag,
            )
            assert ups["server"].returncode == 0, diag()
        finally:
            stop_hosts(ups)
    audit = (tmp_path / "fleet" / "server" / "audit.jsonl").read_text().splitlines()
    accepted = sorted(
        e["robot_id"]
        for e in map(json.loads, audit)
        if e["kind"] == "update" and e["round"] == 0 and e["accepted"]
    )
    assert accepted == list(ROBOTS), audit


@needs_netns
def test_across_namespaces_without_multicast_only_the_discovery_server_connects():
    # The bench's own run: server and two robots on three hosts whose bridge drops multicast.
    quick = {"hosts": 2, "per_process": 1, "settle_s": 0, "steady_s": 0.5}
    simple = bench.run_once(2, "simple-nomc", timeout_s=8, **quick)
    served = bench.run_once(2, "server-nomc", timeout_s=60, **quick)

    assert simple.created == 3 and simple.matched == 0, simple
    assert served.matched == 3 and served.launch_to_matched_s is not None, served

"""`fed-ros robot`: operate one robot of a fleet without ros2cli (the pip wheels have none).

    fed-ros robot [fleet.yaml] ID reset [--task T] [--variation V] [--seed S]
    fed-ros robot [fleet.yaml] ID record start|stop|discard [--label success|failure] [--task T]
    fed-ros robot [fleet.yaml] ID learning on|off
    fed-ros robot [fleet.yaml] ID evaluate [--episodes N] [--seed S]
    fed-ros robot [fleet.yaml] ID estop [--release]

Names (the plan puts robot ``ID`` in namespace ``/ID``): the robot node ``/ID/robot`` serves
``/ID/record`` (fed_ros/srv/Record), ``/ID/evaluate`` (fed_ros/srv/EvaluatePolicy) and
``/ID/robot/set_learning`` (std_srvs/srv/SetBool, the learning gate); the arm adapter (or a
simulated arm) serves ``/ID/arm/reset`` (fed_ros/srv/ResetEpisode: the arm goes home and an
episode starts, which a teleoperator needs before the arm takes commands) and subscribes
``/ID/arm/hold`` (std_msgs/msg/Bool, reliable: true stops the arm at once).

The ROS domain is found as `fed-ros status` finds it: ``--domain-id``, else what `fed-ros up`
recorded for ``fleet.yaml``, else ROS_DOMAIN_ID. A fleet file is told from a robot id by its
``.`` or ``/`` (ROS names have neither).

Calls (fed_ros.ros.wire.service_calls): set_learning and the hold are sent again while
unanswered (repeating them is harmless); Record, ResetEpisode and EvaluatePolicy are sent once
(a second START would answer "already recording", a second STOP "STOP without START", a second
reset or evaluation would drive the arm again).

Exit codes: 0 the robot answered ok; 1 it answered not ok, or no answer came within
``--timeout``; 2 bad usage, or the service (adapter) was not found within ``--find-timeout``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading

from fed_ros.ros.fleet.cli import DISCOVERY_RANGES, status_discovery_range

# A robot id (fed_ros.ros.configuration.fleet_params.ID_RE).
ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
# Seconds to wait for an answer, per command (--timeout); evaluations drive the arm for minutes.
ANSWER_TIMEOUT_S = {
    "reset": 120.0,  # the home trajectory (a profile's home_duration_s) plus its tolerance check
    "record": 120.0,
    "learning": 30.0,
    "evaluate": 3600.0,
    "estop": 10.0,
}


class Unreachable(Exception):
    """The service or topic was not found (exit 2)."""


class NoAnswer(Exception):
    """Found, but no answer in time (exit 1)."""


# --------------------------------------------------------------------------- arguments


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--domain-id", type=int, default=None, help="the fleet's ROS_DOMAIN_ID")
    common.add_argument(
        "--discovery-range",
        default=None,
        choices=DISCOVERY_RANGES,
        help="ROS_AUTOMATIC_DISCOVERY_RANGE (default: as `fed-ros status`)",
    )
    common.add_argument(
        "--find-timeout",
        type=float,
        default=15.0,
        help="seconds to wait for the robot's service (the adapter) to appear",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds to wait for the answer (default: reset 120, record 120, learning 30, "
        "evaluate 3600, estop 10)",
    )
    parser = argparse.ArgumentParser(
        prog="fed-ros robot",
        description=__doc__,
        usage="fed-ros robot [fleet.yaml] ID {reset,record,learning,evaluate,estop} ...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("robot_id", help="robot id: its node is /<ID>/robot")
    actions = parser.add_subparsers(dest="action", required=True)
    reset = actions.add_parser(
        "reset", parents=[common], help="send the arm home and start an episode (arm/reset)"
    )
    reset.add_argument("--task", default="", help="the episode's task (default: the arm's own)")
    reset.add_argument("--variation", default="", help="the scene variation (default: kept)")
    reset.add_argument(
        "--seed", type=int, default=-1, help="scene seed of a simulated arm (-1: its next one)"
    )
    record = actions.add_parser(
        "record", parents=[common], help="start / stop / discard a demonstration"
    )
    record.add_argument("command", choices=("start", "stop", "discard"))
    record.add_argument(
        "--label",
        choices=("success", "failure"),
        default="success",
        help="on stop: whether the demonstration succeeded (failures are never trained on)",
    )
    record.add_argument("--task", default="", help="on start: the task (default: the robot's own)")
    record.add_argument("--instruction", default="", help="on start: the language instruction")
    learning = actions.add_parser("learning", parents=[common], help="switch the learning gate")
    learning.add_argument("state", choices=("on", "off"))
    evaluate = actions.add_parser(
        "evaluate", parents=[common], help="evaluate the robot's model on its arm"
    )
    evaluate.add_argument(
        "--episodes", type=int, default=0, help="episodes per task (0: the robot's eval_episodes)"
    )
    evaluate.add_argument("--seed", type=int, default=0)
    estop = actions.add_parser(
        "estop", parents=[common], help="stop the arm at once (arm/hold true)"
    )
    estop.add_argument("--release", action="store_true", help="release the hold (arm/hold false)")
    return parser


def _split_fleet(argv: list[str]) -> tuple[str | None, list[str]]:
    """A leading fleet file (its name has a '.' or '/', a robot id never does) and the rest."""
    if argv and not argv[0].startswith("-") and ("." in argv[0] or "/" in argv[0]):
        return argv[0], argv[1:]
    return None, argv


def _use_fleet_domain(fleet: str | None, robot_id: str, args: argparse.Namespace) -> None:
    """Set ROS_DOMAIN_ID / ROS_AUTOMATIC_DISCOVERY_RANGE as `fed-ros status` does.

    ValueError: a bad fleet.
    """
    recorded: dict = {}
    if fleet:
        from fed_ros.ros.fleet.launcher import fleet_state
        from fed_ros.ros.fleet.fleet_file import load_fleet_config

        config = load_fleet_config(fleet)
        ids = [r.robot_id for r in config.robots]
        if robot_id not in ids:
            raise ValueError(
                f"robot {robot_id!r} is not in fleet {config.name!r} (robots: {', '.join(ids)})"
            )
        recorded = fleet_state(config)
    domain = args.domain_id if args.domain_id is not None else recorded.get("domain_id")
    if domain is not None:
        os.environ["ROS_DOMAIN_ID"] = str(int(domain))
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = status_discovery_range(
        args.discovery_range,
        recorded.get("discovery_range"),
        os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE"),
    )


def _where() -> str:
    return (
        f"ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', 0)}, "
        f"discovery range {os.environ.get('ROS_AUTOMATIC_DISCOVERY_RANGE')}"
    )


# ----------------------------------------------------------------------------- ROS


class Session:
    """A short-lived node in its own context, spun by a thread.

    service_calls.threaded waits on it.
    """

    def __init__(self) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(
            f"fed_ros_robot_cli_{os.getpid()}", context=self.context, start_parameter_services=False
        )
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self.executor.spin, daemon=True)
        self._thread.start()

    def client(self, srv_type, name: str, find_s: float):
        """A client of ``name`` once its server is discovered, else Unreachable naming it."""
        from fed_ros.ros import shutdown

        client = self.node.create_client(srv_type, name)
        if not shutdown.wait_for_service(client, find_s):
            kind = f"{srv_type.__module__.split('.')[0]}/srv/{srv_type.__name__}"
            raise Unreachable(
                f"no service {name} ({kind}) in {_where()} within {find_s:g} s: "
                "is the robot node running (and is this its domain)?"
            )
        return client

    def close(self) -> None:
        import rclpy

        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self._thread.join(
            timeout=5.0
        )  # a spin thread alive at exit aborts the process (std::terminate)


def _once(client, request, timeout_s: float):
    """One try (not safe to repeat): the response, else NoAnswer."""
    from fed_ros.ros.wire.service_calls import call_service

    response = call_service(client, request, timeout_s)
    if response is None:
        raise NoAnswer(
            f"no answer from {client.srv_name} within {timeout_s:g} s "
            "(the robot may still have acted on it)"
        )
    return response


def _report(what: str, ok: bool, message: str, lines: list[str]) -> int:
    if ok:
        print(f"{what}: ok ({message})")
        for line in lines:
            print(f"  {line}")
        return 0
    print(f"fed-ros robot: {what}: not ok: {message}", file=sys.stderr)
    return 1


def reset(session: Session, robot_id: str, args: argparse.Namespace) -> int:
    """ResetEpisode once: the arm goes home and an episode starts (prints its number and
    instruction)."""
    from fed_ros.srv import ResetEpisode

    client = session.client(ResetEpisode, f"/{robot_id}/arm/reset", args.find_timeout)
    request = ResetEpisode.Request(task=args.task, variation=args.variation, seed=args.seed)
    response = _once(client, request, args.timeout)
    lines = [f"episode: {response.episode}", f"instruction: {response.instruction}"]
    return _report(client.srv_name, response.ok, response.message, lines if response.ok else [])


def record(session: Session, robot_id: str, args: argparse.Namespace) -> int:
    """Record START (task: --task, else the robot's own) / STOP (success from --label) / DISCARD."""
    from fed_ros.srv import Record

    client = session.client(Record, f"/{robot_id}/record", args.find_timeout)
    request = Record.Request()
    request.command = {
        "start": Record.Request.START,
        "stop": Record.Request.STOP,
        "discard": Record.Request.DISCARD,
    }[args.command]
    request.task, request.instruction = args.task, args.instruction
    request.success = args.label == "success"
    response = _once(client, request, args.timeout)
    lines = [f"episode: {response.episode_path}"] if response.episode_path else []
    if args.command == "stop":
        lines.append(f"steps: {response.num_steps}")
    return _report(
        f"{client.srv_name} {args.command.upper()}", response.ok, response.message, lines
    )


def learning(session: Session, robot_id: str, args: argparse.Namespace) -> int:
    """SetBool on the robot's learning gate, asked again while unanswered."""
    from std_srvs.srv import SetBool
    from fed_ros.ros.wire.service_calls import call_client_until_answered, threaded

    client = session.client(SetBool, f"/{robot_id}/robot/set_learning", args.find_timeout)
    try:
        response = call_client_until_answered(
            client,
            SetBool.Request(data=args.state == "on"),
            threaded(),
            attempt_s=min(5.0, args.timeout),
            timeout_s=args.timeout,
        )
    except TimeoutError as exc:
        raise NoAnswer(str(exc)) from None
    return _report(f"{client.srv_name} {args.state}", response.success, response.message, [])


def evaluate(session: Session, robot_id: str, args: argparse.Namespace) -> int:
    """EvaluatePolicy once; prints the success rate per task."""
    from fed_ros.srv import EvaluatePolicy

    client = session.client(EvaluatePolicy, f"/{robot_id}/evaluate", args.find_timeout)
    print(f"{client.srv_name}: evaluating (waiting up to {args.timeout:g} s)...", flush=True)
    response = _once(
        client, EvaluatePolicy.Request(episodes=args.episodes, seed=args.seed), args.timeout
    )
    lines = [f"{task}: {rate:.2f}" for task, rate in zip(response.tasks, response.success_rates)]
    lines += [f"mean: {response.mean_success_rate:.2f}"] if response.tasks else []
    return _report(client.srv_name, response.ok, response.message, lines)


def estop(session: Session, robot_id: str, args: argparse.Namespace) -> int:
    """Bool(true) (false: --release) on arm/hold, reliably.

    Sent until every matched adapter acknowledged it.
    """
    from rclpy.duration import Duration
    from rclpy.task import Future
    from std_msgs.msg import Bool
    from fed_ros.ros.wire import qos
    from fed_ros.ros.wire.publish import wait_for_subscribers
    from fed_ros.ros.wire.service_calls import call_until_answered

    topic = f"/{robot_id}/arm/hold"
    pub = session.node.create_publisher(
        Bool, topic, qos.command_qos(depth=10)
    )  # what the adapter subscribes
    try:
        wait_for_subscribers(session.node, pub, topic, timeout=args.find_timeout)
    except TimeoutError:
        raise Unreachable(
            f"no arm adapter subscribes to {topic} (std_msgs/msg/Bool) in {_where()} "
            f"within {args.find_timeout:g} s: is the arm adapter running?"
        ) from None
    attempt_s = min(2.0, args.timeout)

    def send() -> Future:  # "answered" once every matched subscription acknowledged the sample
        pub.publish(Bool(data=not args.release))
        future = Future()
        if pub.wait_for_all_acked(Duration(seconds=attempt_s)):
            future.set_result(pub.get_subscription_count())
        return future

    try:
        count = call_until_answered(
            send,
            lambda future, _s: future.done(),
            attempt_s=attempt_s,
            timeout_s=args.timeout,
            what=topic,
        )
    except TimeoutError as exc:
        raise NoAnswer(str(exc)) from None
    state = "false (released)" if args.release else "true (arm stopped)"
    return _report(f"{topic} {state}", True, f"acknowledged by {count} subscriber(s)", [])


ACTIONS = {
    "reset": reset,
    "record": record,
    "learning": learning,
    "evaluate": evaluate,
    "estop": estop,
}


def main(argv: list[str]) -> int:
    """`fed-ros robot [fleet.yaml] ID reset|record|learning|evaluate|estop ...`.

    See the module docstring.
    """
    fleet, rest = _split_fleet(list(argv))
    args = _parser().parse_args(rest)  # bad usage: exit 2
    if args.timeout is None:
        args.timeout = ANSWER_TIMEOUT_S[args.action]
    try:
        if not ID_RE.match(args.robot_id):
            raise ValueError(f"a robot id matches {ID_RE.pattern}, got {args.robot_id!r}")
        if args.timeout <= 0 or args.find_timeout <= 0:
            raise ValueError("--timeout and --find-timeout must be > 0")
        if args.domain_id is not None and not 0 <= args.domain_id <= 232:
            raise ValueError(f"--domain-id must be in [0, 232], got {args.domain_id}")
        if getattr(args, "episodes", 0) < 0:
            raise ValueError(f"--episodes must be >= 0, got {args.episodes}")
        _use_fleet_domain(fleet, args.robot_id, args)
    except ValueError as exc:
        print(f"fed-ros robot: {exc}", file=sys.stderr)
        return 2
    session = Session()
    try:
        return ACTIONS[args.action](session, args.robot_id, args)
    except (Unreachable, ValueError) as exc:
        print(f"fed-ros robot: {exc}", file=sys.stderr)
        return 2
    except NoAnswer as exc:
        print(f"fed-ros robot: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while waiting (e.g. for an evaluation): the robot goes on
        print("fed-ros robot: interrupted; the robot may still act on the request", file=sys.stderr)
        return 130
    finally:
        session.close()

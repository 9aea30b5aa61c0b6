"""Participants for `fed-ros bench discovery`: several DDS participants in one process.

Each participant is its own rclpy Context (one DDS participant per context) with one node
shaped like a fleet member: the server publishes announcements and subscribes to updates, a
robot the other way round, so robots match the server and never each other (the fleet's star).
The process prints a JSON line as each participant is created and as it matched what it expects
(a robot: the server's reader and writer; the server: every robot's), so a worker killed on a
loaded machine still leaves its record, and keeps its participants alive until SIGINT/SIGTERM
or ``--deadline-s``, so the discovery traffic after matching can be measured too.

    python -m fed_ros.ros.bench.discovery_worker --role robot --first 0 --count 20 --expect 1
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass

import rclpy
from rclpy.context import Context
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.subscription import Subscription
from std_msgs.msg import Empty

ANNOUNCE_TOPIC = "/bench_discovery/announce"
UPDATE_TOPIC = "/bench_discovery/updates"
POLL_S = 0.05  # match counts come from the rmw's discovery threads; polling costs nothing there


@dataclass
class Participant:
    """One DDS participant: its context, node, endpoints and when it was created and matched."""

    name: str
    context: Context
    node: Node
    publisher: Publisher
    subscription: Subscription
    created: float
    matched: float | None = None

    def is_matched(self, expect: int) -> bool:
        """Both endpoints matched at least ``expect`` remote endpoints."""
        return (
            self.publisher.get_subscription_count() >= expect
            and self.subscription.get_publisher_count() >= expect
        )


def make_participant(name: str, role: str) -> Participant:
    """A context with one node: server (announce out, updates in) or robot (the reverse)."""
    context = Context()
    rclpy.init(context=context, signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = Node(name, context=context)
    out_topic, in_topic = (
        (ANNOUNCE_TOPIC, UPDATE_TOPIC) if role == "server" else (UPDATE_TOPIC, ANNOUNCE_TOPIC)
    )
    publisher = node.create_publisher(Empty, out_topic, 1)
    subscription = node.create_subscription(Empty, in_topic, lambda _msg: None, 1)
    return Participant(name, context, node, publisher, subscription, time.time())


def main(argv: list[str] | None = None) -> int:
    """Create the participants, report when all matched, hold them until told to stop."""
    parser = argparse.ArgumentParser(prog="discovery_worker")
    parser.add_argument("--role", choices=("server", "robot"), required=True)
    parser.add_argument("--first", type=int, default=0, help="index of the first robot here")
    parser.add_argument("--count", type=int, default=1, help="participants in this process")
    parser.add_argument("--expect", type=int, required=True, help="remote endpoints to match")
    parser.add_argument("--deadline-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    stop = [False]

    def on_signal(_signum: int, _frame: object) -> None:
        stop[0] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    started = time.monotonic()
    names = (
        ["server"]
        if args.role == "server"
        else [f"robot_{args.first + i}" for i in range(args.count)]
    )
    participants: list[Participant] = []
    try:
        for name in names:
            if stop[0]:
                break
            participants.append(make_participant(name, args.role))
            _emit({"name": name, "created": participants[-1].created})
        while not stop[0] and time.monotonic() - started < args.deadline_s:
            now = time.time()
            for p in participants:
                if p.matched is None and p.is_matched(args.expect):
                    p.matched = now
                    _emit({"name": p.name, "matched": now})
            time.sleep(POLL_S)
        return 0 if all(p.matched is not None for p in participants) else 1
    finally:
        for p in participants:
            p.node.destroy_node()
            p.context.try_shutdown()


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    sys.exit(main())

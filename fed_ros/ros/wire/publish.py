"""Waiting until a publisher can deliver (used by the robot node and scripted test robots)."""

from __future__ import annotations

import time

from fed_ros.ros import shutdown


def wait_for_subscribers(
    node, pub, what: str, timeout: float = 30.0, all_matched_grace_s: float = 3.0
) -> None:
    """Block until ``pub`` can deliver: matched by at least one subscription and, preferably, by
    every subscription the ROS graph lists on its topic.

    "count > 0" alone is not enough after a server restart: a SIGKILLed server's subscription
    stays listed (and matched) until its DDS lease expires, and the new one shows up in the graph
    a moment before our writer matches it, so a fast answer would reach only the dead server.
    A listed subscription that never matches (incompatible QoS, e.g. a monitoring tool) is
    waited for ``all_matched_grace_s`` only. Raises TimeoutError naming ``what`` when nobody
    matches within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    some_matched_since = None
    while True:
        matched = pub.get_subscription_count()
        if matched > 0:
            some_matched_since = some_matched_since or time.monotonic()
            if (
                node.count_subscribers(pub.topic_name) <= matched
                or time.monotonic() - some_matched_since >= all_matched_grace_s
            ):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody subscribes to {what} after {timeout:.0f} s")
        shutdown.sleep(0.05, getattr(node, "stop_event", None))  # the robot node's own stop flag

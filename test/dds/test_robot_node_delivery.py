"""The robot node publishes an update or descriptor only once the server can receive it.

Real rclpy endpoints on loopback: a subscription with incompatible QoS is listed in the graph
but never matched (the situation of a monitoring tool), which is the case the grace exists for;
with no compatible subscriber at all the wait fails naming what it waited for.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.ros


@pytest.fixture
def node(ros_env):
    import rclpy

    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("delivery_test", context=context)
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=context)


def _incompatible_qos():
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    # A TRANSIENT_LOCAL reader cannot match the VOLATILE update writer.
    return QoSProfile(
        depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL
    )


def _wait_listed(node, topic, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while node.count_subscribers(topic) < count:
        assert time.monotonic() < deadline, (
            f"{topic}: {node.count_subscribers(topic)} of {count} listed"
        )
        time.sleep(0.05)


def test_waits_for_a_matched_subscriber_and_names_the_topic_on_timeout(node):
    from std_msgs.msg import String
    from fed_ros.ros.wire import qos
    from fed_ros.ros.wire.publish import wait_for_subscribers

    pub = node.create_publisher(String, "/fleet/updates", qos.control_qos())
    node.create_subscription(String, "/fleet/updates", lambda m: None, _incompatible_qos())
    _wait_listed(node, "/fleet/updates", 1)
    with pytest.raises(TimeoutError, match="the fleet's updates topic"):
        wait_for_subscribers(node, pub, "the fleet's updates topic", timeout=1.0)


def test_all_listed_subscribers_matched_returns_at_once_else_after_the_grace(node):
    from std_msgs.msg import String
    from fed_ros.ros.wire import qos
    from fed_ros.ros.wire.publish import wait_for_subscribers

    pub = node.create_publisher(String, "/fleet/updates", qos.control_qos())
    node.create_subscription(String, "/fleet/updates", lambda m: None, qos.control_qos())
    _wait_listed(node, "/fleet/updates", 1)
    t0 = time.monotonic()
    wait_for_subscribers(node, pub, "updates", timeout=10.0, all_matched_grace_s=4.0)
    assert pub.get_subscription_count() == 1 and time.monotonic() - t0 < 3.0
    # A listed subscription that can never match delays the send by the grace, not forever.
    node.create_subscription(String, "/fleet/updates", lambda m: None, _incompatible_qos())
    _wait_listed(node, "/fleet/updates", 2)
    t0 = time.monotonic()
    wait_for_subscribers(node, pub, "updates", timeout=10.0, all_matched_grace_s=4.0)
    assert 3.9 <= time.monotonic() - t0 < 8.0

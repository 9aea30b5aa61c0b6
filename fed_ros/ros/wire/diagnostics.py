"""``/diagnostics`` (diagnostic_msgs/DiagnosticArray) for the fleet's nodes, about 1 Hz.

The statuses are built by the pure helpers of :mod:`fed_ros.core.diagnostics` from a reading
that each node's gauge takes of its collaborators (``nodes/robot/gauge.py``,
``nodes/server/gauge.py``, ``nodes/arm_adapter/gauge.py``); this module publishes them. A node
hands it its publisher and timer factories, never itself::

    attach(self.create_publisher, self.create_timer, now_msg, gauge)

``/diagnostics`` is absolute (what rqt_robot_monitor and Foxglove read, via the aggregator
or directly); status names are ``fed_ros/<node namespace>/<role>`` so robots do not collide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fed_ros.core import diagnostics as D

TOPIC = "/diagnostics"
PERIOD_S = 1.0


def to_msg(statuses: list[D.Status], stamp) -> Any:
    """Statuses -> DiagnosticArray."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

    array = DiagnosticArray()
    array.header.stamp = stamp
    for s in statuses:
        array.status.append(
            DiagnosticStatus(
                level=bytes([s.level]),
                name=s.name,
                message=s.message[:1000],
                hardware_id=s.hardware_id,
                values=[KeyValue(key=k, value=v[:1000]) for k, v in s.values.items()],
            )
        )
    return array


def status_name(namespace: str, role: str) -> str:
    """``fed_ros/<node namespace>/<role>``: robots in their own namespaces do not collide."""
    ns = namespace.strip("/")
    return f"fed_ros/{ns}/{role}" if ns else f"fed_ros/{role}"


def attach(
    create_publisher: Callable[..., Any],
    create_timer: Callable[..., Any],
    now_msg: Callable[[], Any],
    gauge: Callable[[], D.Status],
    period_s: float = PERIOD_S,
    callback_group: Any = None,
) -> Any:
    """Publish ``gauge()``'s status on /diagnostics every ``period_s``; returns the timer. A gauge
    that raises publishes one ERROR status naming the exception (its ``name`` attribute, when
    it has one, names the status) instead of stopping the node's timer."""
    from diagnostic_msgs.msg import DiagnosticArray

    # As diagnostic_updater: reliable, depth 10.
    pub = create_publisher(DiagnosticArray, TOPIC, 10)

    def publish() -> None:
        try:
            status = gauge()
        except Exception as exc:  # noqa: BLE001 - a broken gauge must say so, not kill the node
            status = D.Status(
                str(getattr(gauge, "name", "fed_ros")),
                D.ERROR,
                f"diagnostics failed: {type(exc).__name__}: {exc}",
            )
        pub.publish(to_msg([status], now_msg()))

    return create_timer(period_s, publish, callback_group=callback_group)

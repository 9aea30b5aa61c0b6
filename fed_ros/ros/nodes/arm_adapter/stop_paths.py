"""The arm's stop paths: each one ends with a zero command on the arm's topics.

A zero command is a zero twist, zero joint velocities (the current positions on a position
interface) and the gripper held at its last commanded position
(:meth:`fed_ros.ros.nodes.arm_adapter.arm_commands.ArmCommandOutput.send_zero`). Every path sends it
*after* the policy's last command, because the arm adapter sends it under the lock every tick takes
and latches a hold first, and the robot's arm client (:class:`fed_ros.ros.arm.arm_client.ArmClient`)
drops every command after its HOLD.

| stop path                                 | who sends the zero                                  |
|-------------------------------------------|-----------------------------------------------------|
| SIGINT / SIGTERM of the adapter           | adapter: :func:`stop_and_linger` (main)             |
| SIGINT / SIGTERM of the robot node        | robot node: ``ArmClient.halt`` -> HOLD -> adapter   |
| whole fleet (`fed-ros up`, `ros2 launch`) | both, in order: robot node first, the adapter last  |
| an exception in the adapter's tick        | adapter: its control loop catches it, stops the arm |
| the robot node dies (SIGKILL, crash)      | adapter: the watchdog (``watchdog_timeout_s``)      |
| learning switched off mid-episode         | robot node: the learning gate halts the arm client  |
| e-stop (``arm/hold`` true)                | adapter: at once, latched until ``arm/hold`` false  |
| the adapter dies (SIGKILL, power loss)    | the arm's own command timeout (docs/arms.md)        |

The adapter's control loop is :class:`fed_ros.ros.nodes.arm_adapter.control.ArmControlLoop`.

Order under `ros2 launch`: every node gets SIGINT at once. The adapter then holds the arm (its
ticks send the zero) while the robot node's command publisher is still in the graph, at most
:data:`SHUTDOWN_LINGER_S`, and sends a last zero before it exits; `fed-ros up` stops the nodes
in order itself (:mod:`fed_ros.ros.fleet.launcher`).
"""

from __future__ import annotations

import time

# At shutdown the adapter keeps the arm held while the policy side (the robot node) is still up,
# at most this long: the adapter must be the last to command the arm. Below launch's SIGTERM
# (5 s) and the shutdown stack dump (fed_ros.ros.shutdown.STACKS_AFTER_S, 4 s).
SHUTDOWN_LINGER_S = 2.0
# How long the last zero command may take to be acknowledged by the arm's subscribers.
ZERO_ACK_TIMEOUT_S = 1.0


def stop_and_linger(adapter, spin_once, linger_s: float = SHUTDOWN_LINGER_S) -> None:
    """The adapter's shutdown: zero now (latched for good), hold while the policy side is up,
    a last zero, then wait until the arm's subscribers acknowledged it.

    ``adapter`` is the arm adapter node (``stop_arm``, ``policy_publishers``, ``commands``);
    ``spin_once`` runs its executor once (ticks go on meanwhile, each sending the held zero).
    """
    from rclpy.duration import Duration

    adapter.stop_arm("shutdown", final=True)
    deadline = time.monotonic() + linger_s
    while adapter.policy_publishers() > 0 and time.monotonic() < deadline:
        spin_once(0.05)
    adapter.stop_arm("shutdown: last command to the arm", final=True)
    for pub in adapter.commands.publishers():
        pub.wait_for_all_acked(Duration(seconds=ZERO_ACK_TIMEOUT_S))

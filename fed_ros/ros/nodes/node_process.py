"""The life of a fed_ros node process: build the node, spin until asked to stop, stop, tear down.

The server, robot, arm adapter, sim bridge and teleop executables run this one loop; each says
only what differs: its executor's threads, when it ends by itself (the server after its last
round, a robot whose start-up failed) and what it does on the way out (the arm adapter's zero
command, teleop's HOLD, the server's wait for STAGE_DONE to be acknowledged). The expert driver
is not one of them: its main thread drives episodes while a background thread spins.

rclpy's own signal handlers are off (:func:`fed_ros.ros.shutdown.init`): Ctrl-C / SIGTERM only
set a flag this loop observes, so ``stop`` runs before anything is torn down.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

import rclpy
from rclpy.executors import (
    Executor,
    ExternalShutdownException,
    MultiThreadedExecutor,
    SingleThreadedExecutor,
)
from rclpy.node import Node

from fed_ros.ros import shutdown

NodeT = TypeVar("NodeT", bound=Node)

SPIN_PERIOD_S = 0.1  # how long one spin waits; the stop flag is looked at in between


def run_node(
    name: str,
    make_node: Callable[[], NodeT],
    args: list[str] | None = None,
    *,
    threads: int,
    config_errors: tuple[type[Exception], ...] = (ValueError,),
    ended: Callable[[NodeT], bool] = lambda node: False,
    stop: Callable[[NodeT, Executor], int | None] | None = None,
    shutdown_executor: bool = True,
) -> int:
    """Run one node until Ctrl-C / SIGTERM or ``ended(node)``; return the exit code.

    - ``name`` names the executable in a configuration error: ``make_node`` raising one of
      ``config_errors`` prints "fed_ros NAME: invalid configuration: ..." and returns 2 (a bad
      parameter, named; no traceback and nothing to stop).
    - ``threads``: 1 spins a SingleThreadedExecutor, more a MultiThreadedExecutor.
    - ``stop(node, executor)`` runs once the spin ends, however it ended (check ``rclpy.ok()``
      before publishing); its return value is the exit code (None: 0).
    - ``shutdown_executor``: shut the executor down before the node is destroyed (the nodes
      whose ``stop`` spins it once more).
    """
    shutdown.init(args)  # Ctrl-C sets a flag every wait observes (fed_ros.ros.shutdown)
    node: NodeT | None = None
    executor: Executor = (
        SingleThreadedExecutor() if threads == 1 else MultiThreadedExecutor(num_threads=threads)
    )
    code = 0
    try:
        try:
            node = make_node()
        except config_errors as exc:
            print(f"fed_ros {name}: invalid configuration: {exc}", file=sys.stderr)
            return 2
        executor.add_node(node)
        while rclpy.ok() and not ended(node) and not shutdown.requested():
            executor.spin_once(timeout_sec=SPIN_PERIOD_S)
        if stop is not None:
            code = stop(node, executor) or 0
    except (KeyboardInterrupt, ExternalShutdownException):
        code = 0
    finally:
        if shutdown_executor:
            executor.shutdown()
        if node is not None:
            node.destroy_node()  # a robot's worker stops: its waits give up within POLL_S
        rclpy.try_shutdown()
    return code

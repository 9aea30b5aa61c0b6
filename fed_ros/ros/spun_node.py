"""An rclpy node in a private Context, spun on a background thread.

For code that talks to ROS from an ordinary Python call (evaluation through a bridge, the
bridge benchmark, tests) without touching the process's default context, so it can run
beside a node of its own or be called many times in one process.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def spun_node(name: str, threads: int = 2) -> Iterator:
    """Yield a node spun by a ``MultiThreadedExecutor`` (``threads``) on a daemon thread.

    Subscriptions and clients may be created on the node after it started spinning. On exit
    the executor stops, the node and its context are shut down and the spinner is joined.
    """
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    context = rclpy.Context()
    rclpy.init(context=context)
    executor = MultiThreadedExecutor(num_threads=threads, context=context)
    node = rclpy.create_node(name, context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True, name=f"spin-{name}")
    spinner.start()
    try:
        yield node
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=context)
        spinner.join(timeout=5)

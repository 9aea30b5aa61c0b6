"""An arm adapter started beside a sim bridge (ros2_control interface) and a spun test node: shared
by the adapter, recording and stop-path tests."""

from __future__ import annotations

import threading
from pathlib import Path
import pytest


rclpy = pytest.importorskip("rclpy")


ADAPTER = "fed_ros.ros.nodes.arm_adapter.arm_adapter_node"


BRIDGE = "fed_ros.ros.nodes.sim_bridge.sim_bridge_node"


class Spun:
    """An in-process node spun by a MultiThreadedExecutor thread (own context)."""

    def __init__(self, name: str, namespace: str = "") -> None:
        from rclpy.executors import MultiThreadedExecutor

        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node(name, namespace=namespace, context=self.context)
        self.executor = MultiThreadedExecutor(num_threads=3, context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self.thread.join(timeout=5)


def start_adapter(processes, env, log: Path, namespace: str, **params):
    args = ["-m", ADAPTER, "--ros-args", "-r", f"__ns:={namespace}"]
    for k, v in params.items():
        args += ["-p", f"{k}:={v}"]
    return processes.python(args, env, log_path=log)


def _try_reset(client):
    try:
        return client.reset("lift", timeout=30.0)
    except RuntimeError:  # not ready yet (topics still being discovered)
        return None

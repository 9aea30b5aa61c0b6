"""Benchmark of a bridge process: control steps per second of ``sim_bridge_node`` driven over
ROS, for ``fed-ros bench sim`` (``bridge_steps_per_second``).

It starts its own bridge in a private ROS domain, drives it with :class:`ArmClient` like any
policy would, and reads the rate from the bridge's own episode-status stamps. Measuring a bridge
is not evaluating a policy through one (:mod:`fed_ros.ros.arm.policy_evaluation`): it owns a child
process, an environment of its own and a timing method, so it stands apart.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from fed_ros.ros.arm import topics as at
from fed_ros.ros.arm.arm_client import ArmClient
from fed_ros.ros.spun_node import spun_node


class _ZeroPolicy:
    """Holds the arm still (benchmarks: the bridge's cost, not a policy's)."""

    def reset(self) -> None:
        pass

    def act(self, obs: dict[str, Any]) -> np.ndarray:
        return np.array([0.0, 0.0, 0.0, -1.0], dtype=np.float32)


def measure_bridge_steps_per_second(
    task: str = "lift",
    cameras: bool = True,
    image_size: int = 84,
    steps: int = 100,
    lockstep: bool = False,
    seed: int = 0,
    variation: str = "default",
    expert: bool = True,
    timeout: float = 600.0,
) -> float:
    """Control steps per second of a bridge process with these render settings.

    Free-running (``lockstep=False``): the control rate is set far above what the machine
    sustains, so the bridge steps back to back while the scripted expert (or a hold, with
    ``expert=False``) commands it over ROS; the rate comes from the stamps of the bridge's
    own episode statuses (publishing included, subscriber lag and resets excluded).
    ``lockstep=True`` times the full round trip: every observation is answered over ROS.
    """
    import os
    import random
    import signal
    import subprocess
    import sys

    if steps < 10:
        raise ValueError(f"steps must be >= 10, got {steps!r}")
    env = dict(os.environ)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env["ROS_DOMAIN_ID"] = str(random.SystemRandom().randint(161, 215))
    args = [
        sys.executable,
        "-m",
        "fed_ros.ros.nodes.sim_bridge.sim_bridge_node",
        "--ros-args",
        "-p",
        f"task:={task}",
        "-p",
        f"variation:={variation}",
        "-p",
        f"cameras:={'true' if cameras else 'false'}",
        "-p",
        f"image_size:={int(image_size)}",
        "-p",
        f"seed:={int(seed)}",
        "-p",
        f"lockstep:={'true' if lockstep else 'false'}",
        "-p",
        "control_rate_hz:=1000.0",
        "--log-level",
        "error",
    ]
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    saved = {k: os.environ.get(k) for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")}
    os.environ["ROS_DOMAIN_ID"] = env["ROS_DOMAIN_ID"]
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = env["ROS_AUTOMATIC_DISCOVERY_RANGE"]
    try:
        with spun_node("bridge_bench") as node:
            return _measure_bridge_rate(
                node, task, cameras, steps, lockstep, seed, variation, expert, timeout
            )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=5)


def _measure_bridge_rate(
    node,
    task: str,
    cameras: bool,
    steps: int,
    lockstep: bool,
    seed: int,
    variation: str,
    expert: bool,
    timeout: float,
) -> float:
    """The measurement of ``measure_bridge_steps_per_second`` on a spun node."""
    from fed_ros.msg import EpisodeStatus

    # episode -> step -> stamp (ns), from the bridge's own statuses
    stamps: dict[int, dict[int, int]] = {}
    lock = threading.Lock()

    def on_status(msg) -> None:
        with lock:
            stamps.setdefault(int(msg.episode), {})[int(msg.step)] = at.stamp_to_ns(
                msg.header.stamp
            )

    node.create_subscription(
        EpisodeStatus, at.EPISODE_STATUS_TOPIC, on_status, at.qos_for(at.EPISODE_STATUS_TOPIC)
    )
    client = ArmClient(node, cameras=cameras, source="bench")
    try:
        client.wait_for_arm(timeout)
        if expert:
            from fed_ros.sim.experts import make_expert

            policy = make_expert(task, seed=seed)
        else:
            policy = _ZeroPolicy()
        deadline = time.monotonic() + timeout
        started = time.perf_counter()
        done_steps, index = 0, 0
        while done_steps < steps + 5:
            _, episode = client.reset(task=task, variation=variation, seed=int(seed) + index)
            index += 1
            outcome = client.run_episode(
                policy,
                episode,
                timeout=max(1.0, deadline - time.monotonic()),
                max_steps=steps + 5 - done_steps,
            )
            if outcome.timed_out:
                raise TimeoutError(f"bridge benchmark episode {episode} timed out")
            done_steps += outcome.steps
        if lockstep:
            return done_steps / (time.perf_counter() - started)
        time.sleep(0.2)  # last statuses in flight
        total_steps, total_ns = 0, 0
        with lock:
            for episode_stamps in stamps.values():
                # From step 1: the reset observation (step 0) is not a control tick.
                ticks = sorted(s for s in episode_stamps if s >= 1)
                if len(ticks) >= 2:
                    total_steps += ticks[-1] - ticks[0]
                    total_ns += episode_stamps[ticks[-1]] - episode_stamps[ticks[0]]
        if total_ns <= 0:
            raise RuntimeError("bridge benchmark saw no control ticks")
        return total_steps / (total_ns / 1e9)
    finally:
        client.destroy()

"""The arm adapter's reset: the home trajectory, wait until the arm is there, start an episode.

A function over the adapter node (:mod:`fed_ros.ros.nodes.arm_adapter_node`), kept apart so
the node stays small; ``self`` is the adapter.
"""
from __future__ import annotations

import time

import numpy as np


def home_and_start(self, request, response):
    """ResetEpisode: send the home trajectory, wait until the arm is there, start an episode."""
    missing = [m for m in self.missing() if "task_success" not in m]
    if self._stopped:
        response.ok, response.message = False, f"the arm adapter has stopped the arm for good ({self._stopped})"
        return response
    if missing or self.commands.home is None:
        response.ok = False
        response.message = ("arm not ready: " + "; ".join(missing) if missing
                            else f"profile {self.profile.name} has no topics.home_trajectory")
        self.get_logger().warning(f"reset refused: {response.message}")
        return response
    prof = self.profile
    with self._lock:
        self._resetting = True
        self._success = False
        self.safety.hold(True)  # drop the last episode's command; released below
        seen = self._joint_msgs
    self.commands.send_home()
    deadline = time.monotonic() + 2.0 * prof.joints.home_duration_s + 5.0
    error = np.full(len(prof.joints.names), np.inf)
    while time.monotonic() < deadline:
        with self._lock:
            joints, fresh = self.state.fresh("joints", time.monotonic()), self._joint_msgs - seen
        if joints is not None:
            error = np.abs(joints[0] - np.asarray(prof.joints.home))
            # Three fresh joint states: the arm (or simulator) has acted on the trajectory.
            if fresh >= 3 and np.all(error <= prof.joints.home_tolerance_rad):
                break
        time.sleep(prof.period_s / 2)
    else:
        with self._lock:
            self._resetting = False
        far = {n: round(float(e), 3) for n, e in zip(prof.joints.names, error)
               if not e <= prof.joints.home_tolerance_rad}
        response.ok = False
        response.message = (f"arm did not reach home within {2.0 * prof.joints.home_duration_s + 5.0:g} s "
                            f"(|error| rad above {prof.joints.home_tolerance_rad:g}: {far})")
        self.get_logger().error(response.message)
        return response
    with self._lock:
        self.task = request.task or self.task
        self.episode += 1
        self.step, self.done, self._success = 0, False, False
        if not self._stopped:  # a shutdown during the home motion keeps its hold
            self.safety.hold(False)
        self._resetting = False
        self._pub_task.publish(self._m["String"](data=self._instruction(self.task)))
        published = self._publish_observation(time.monotonic())  # the reset observation
    response.ok = published
    response.message = (f"episode {self.episode}: {self.task} at home" if published
                        else "arm state went stale right after reaching home")
    response.instruction, response.episode = self._instruction(self.task), self.episode
    self.get_logger().info(response.message)
    return response

"""The arm adapter's ResetEpisode service: when a reset is refused, and how an episode starts.

A reset is refused while the arm is stopped for good (shutdown), while an arm-side topic other
than the success button is missing, or when the profile has no home trajectory. Otherwise the
last episode's command is dropped (hold latched), the arm is sent home and waited for
(:func:`fed_ros.ros.nodes.arm_adapter.home.go_home`), and only once it is there does the next
episode start: the hold released (unless a shutdown came meanwhile), the task's instruction and the
reset observation published. The service's reply says which of these happened.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from fed_ros.ros.nodes.arm_adapter.control import ArmControlLoop
from fed_ros.ros.nodes.arm_adapter.home import go_home


def reset_refusal(stopped: str, missing: list[str], profile_name: str, has_home: bool) -> str:
    """Why a reset cannot start, '' when it can: ``stopped`` (why the arm is stopped for good),
    ``missing`` (arm-side topics not there, the success button left out), ``has_home`` (the
    profile has a home trajectory topic)."""
    return (
        f"the arm adapter has stopped the arm for good ({stopped})"
        if stopped
        else "arm not ready: " + "; ".join(missing)
        if missing
        else f"profile {profile_name} has no topics.home_trajectory"
        if not has_home
        else ""
    )


class EpisodeReset:
    """ResetEpisode: send the home trajectory, wait until the arm is there, start an episode.

    ``control``: the control loop (its lock, safety filter, command output, episode,
    observations, stop latch); ``joints_now`` the newest joint positions and joint-state count
    (:meth:`fed_ros.ros.nodes.arm_adapter.arm_inputs.ArmInputs.joints_now`); ``missing`` the
    arm-side topics not there yet; ``clock`` the monotonic clock of the reset observation.
    """

    def __init__(
        self,
        control: ArmControlLoop,
        joints_now: Callable[[], tuple[np.ndarray | None, int]],
        missing: Callable[[], list[str]],
        logger,
        clock: Callable[[], float],
    ) -> None:
        self._control, self._joints_now, self._missing = control, joints_now, missing
        self._logger, self._clock = logger, clock

    def handle(self, request, response):
        control, episode = self._control, self._control.episode
        missing = [m for m in self._missing() if "task_success" not in m]
        refusal = reset_refusal(
            control.stopped, missing, control.profile.name, control.commands.home is not None
        )
        if refusal:
            response.ok, response.message = False, refusal
            self._logger.warning(f"reset refused: {refusal}")
            return response
        with control.lock:
            episode.resetting, episode.success = True, False
            control.safety.hold(True)  # drop the last episode's command; released below

        failure = go_home(control.commands.send_home, control.profile, self._joints_now)
        with control.lock:
            episode.resetting = False
            if not failure:
                episode.start(request.task)
                if not control.stopped:  # a shutdown during the home motion keeps its hold
                    control.safety.hold(False)
                control.observations.publish_task(episode.instruction())
                published = control.publish_observation(self._clock())  # the reset observation
        if failure:
            response.ok, response.message = False, failure
            self._logger.error(failure)
            return response
        response.ok = published
        response.message = (
            f"episode {episode.number}: {episode.task} at home"
            if published
            else "arm state went stale right after reaching home"
        )
        response.instruction, response.episode = episode.instruction(), episode.number
        self._logger.info(response.message)
        return response

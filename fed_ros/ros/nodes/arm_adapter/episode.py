"""The episode the arm adapter runs: its task, number, step count, end and success.

A step is one observation and the applied command answering it; an episode ends at the arm's
success signal or after ``max_episode_steps`` steps, and the ResetEpisode service
(:mod:`fed_ros.ros.nodes.arm_adapter.reset`) starts the next one once the arm is home. The counters
stand alone because three parts of the adapter share them: the control loop counts the steps,
the observation publisher reports them in every EpisodeStatus, and the reset starts episodes.
Every read and write happens under the adapter's lock (the object holds no lock of its own).
The episode also says who drives the arm (``control``: the policy, or a human who took over).
"""

from __future__ import annotations

from typing import Callable, Mapping

from fed_ros.core.arm.interventions import DEFAULT_HANDBACK_S, ControlArbiter


class AdapterEpisode:
    """The adapter's current episode (``done`` until the first reset starts one)."""

    def __init__(
        self,
        task: str,
        instructions: Mapping[str, str],
        max_steps: int,
        clock: Callable[[], float],
        handback_s: float = DEFAULT_HANDBACK_S,
    ) -> None:
        self.task = task
        # Who drives the arm, the policy or a human at a teleop device, and how often the
        # human stepped in this episode (core.arm.interventions).
        self.control = ControlArbiter(handback_s)
        self._clock = clock
        self.instructions = instructions  # task -> instruction (adapter parameter `instructions`)
        self.max_steps = max_steps  # a live `ros2 param set` changes it between steps
        self.number, self.step, self.done = 0, 0, True
        self.success = False  # the arm's task success signal, this episode
        self.resetting = False  # the home trajectory owns the arm: no ticks, no success

    def instruction(self) -> str:
        """The current task's instruction: the configured one, else the task name in words."""
        return self.instructions.get(self.task, self.task.replace("_", " "))

    def record_success(self, success: bool) -> None:
        """The arm's success signal; ignored while a reset moves the arm home."""
        if not self.resetting:
            self.success = success

    def advance(self) -> None:
        """One more step: the episode is done at success or at the step cap."""
        self.step += 1
        self.done = self.success or self.step >= self.max_steps

    def start(self, task: str) -> None:
        """The next episode, the arm at home; ``task`` '' keeps the current one."""
        self.task = task or self.task
        self.control.new_episode(self._clock())  # the policy drives the next episode
        self.number += 1
        self.step, self.done, self.success = 0, False, False

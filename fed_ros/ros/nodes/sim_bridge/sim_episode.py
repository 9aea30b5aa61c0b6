"""Episode bookkeeping of the simulated arm: the MuJoCo environment, the episode running in
it, and the action a tick applies.

The sim bridge node publishes and times; this holds what it publishes about: which task and
variation are loaded, the episode number, step, done/success, the last observation, the held
gripper and the simulator's velocity addresses. It knows nothing of ROS (no node, no messages),
so a reset request's rules and the stepping are readable (and testable) without a ROS graph.
"""

from __future__ import annotations

import numpy as np

from fed_ros.core.data.episode import ACTION_DIM
from fed_ros.ros.nodes.sim_bridge.command_validation import ValidCommand


def reset_refusal(task: str, variation: str) -> str:
    """Why a reset to ``task``/``variation`` is refused ("" when both are known)."""
    from fed_ros.sim.envs import TASKS, VARIATIONS

    if task not in TASKS:
        return f"unknown task {task!r}; known: {list(TASKS)}"
    if variation not in VARIATIONS:
        return f"unknown variation {variation!r}; known: {sorted(VARIATIONS)}"
    return ""


class SimEpisode:
    """One simulated arm's environment and the episode in it.

    ``seed`` is also the environment's construction seed (it fixes per-env randomisation such
    as the cube size); ``horizon`` 0 keeps the task's default.
    """

    def __init__(self, cameras: bool, image_size: int, seed: int, horizon: int) -> None:
        self.cameras, self.image_size, self.seed, self.horizon = cameras, image_size, seed, horizon
        self.env = None
        self.task = self.variation = ""
        self.episode = 0
        self.step_index = 0
        self.done = True
        self.success = False
        self.steps_total = 0
        self.held_gripper = -1.0  # robosuite resets with the gripper open
        self.obs: dict[str, np.ndarray] | None = None
        self._joint_qvel = self._grip_qvel = None

    def build_env(self, task: str, variation: str) -> None:
        """(Re)build the environment for ``task``/``variation``, closing the previous one."""
        from fed_ros.sim.envs import make_env

        if self.env is not None:
            self.env.close()
        self.env = make_env(
            task,
            variation=variation,
            cameras=self.cameras,
            image_size=self.image_size,
            seed=self.seed,
            horizon=self.horizon or None,
        )
        self.task, self.variation = task, variation
        sim = self.env.raw_env.sim
        # Velocities come straight from the simulator state, as a real driver reports them.
        self._joint_qvel = np.array(
            [sim.model.get_joint_qvel_addr(j) for j in self.env.joint_names]
        )
        self._grip_qvel = np.array(
            [sim.model.get_joint_qvel_addr(j) for j in self.env.gripper_joint_names]
        )

    def switch(self, task: str, variation: str) -> None:
        """Load ``task``/``variation`` for the next reset: a new env only for a new task."""
        if task != self.task:
            self.build_env(task, variation)
        elif variation != self.variation:
            self.env.set_variation(variation)
            self.variation = variation

    def reset(self, seed: int) -> None:
        """Start the next episode from ``seed``."""
        self.obs = self.env.reset(seed=int(seed))
        self.episode += 1
        self.step_index = 0
        self.done = False
        self.success = False
        self.held_gripper = -1.0

    def action_for(self, command: ValidCommand | None) -> tuple[np.ndarray, bool]:
        """The 4-D action a tick applies for ``command`` (None: hold) and whether it holds.

        A hold (no command, or MODE_HOLD) keeps the gripper where the last command put it.
        """
        hold = command is None or command.hold
        if not hold:
            self.held_gripper = command.gripper  # MODE_HOLD keeps the gripper as it is
        action = np.zeros(ACTION_DIM, dtype=np.float32)
        if not hold:
            action[:3] = command.action
        action[3] = self.held_gripper
        return action, hold

    def step(self, action: np.ndarray) -> None:
        """Step the simulator with ``action``; the new observation is ``obs``."""
        self.obs, self.done, self.success = self.env.step(action)
        self.step_index += 1
        self.steps_total += 1

    def velocities(self) -> tuple[np.ndarray, np.ndarray]:
        """(arm joint velocities, gripper joint velocities) of the current simulator state."""
        qvel = self.env.raw_env.sim.data.qvel
        return qvel[self._joint_qvel], qvel[self._grip_qvel]

    def close(self) -> None:
        """Close the simulator."""
        if self.env is not None:
            self.env.close()
            self.env = None

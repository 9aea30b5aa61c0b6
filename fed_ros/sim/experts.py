"""Scripted experts: phase machines over the observation dict, one per task family.

Experts read only what a real arm would also publish (``eef_pos``, ``gripper_qpos`` and
``object_state`` in the robot base frame), so the same expert drives a simulated arm
in-process or through the ROS bridge. Position commands are ``clip(gain * (target - eef),
-1, 1)`` for the OSC position controller; a descending phase ends when the target height is
reached or when the arm stops descending (contact), which copes with varied object sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fed_ros.core.data.episode import (
    ACTION_DIM,
    EEF_POS,
    OBJECT_FIELDS,
    OBJECT_STATE,
    OBJECT_STRIDE,
)
from fed_ros.sim.variations import Variation, resolve_variation

__all__ = [
    "ScriptedExpert",
    "LiftExpert",
    "StackExpert",
    "PickPlaceCanExpert",
    "make_expert",
    "OBJECT_FIELDS",
]

OPEN, CLOSE = -1.0, 1.0


def _obj_pos(obs: dict[str, np.ndarray], index: int) -> np.ndarray:
    state = np.asarray(obs[OBJECT_STATE], dtype=np.float64)
    return state[index * OBJECT_STRIDE : index * OBJECT_STRIDE + 3]


@dataclass
class _Phase:
    """One step of a plan: move to a target with the gripper open or closed."""

    name: str
    gripper: float
    xy_tol: float = 0.01
    z_tol: float = 0.01
    min_steps: int = 0  # dwell (e.g. while the fingers close)
    max_steps: int = 120  # give up on the phase and move on
    stop_on_stall: bool = False  # descending phases end on contact
    slew: float = 2.0  # max change of the position action per step; small = gentle accelerations


class ScriptedExpert:
    """Base phase machine; subclasses define the phases and their targets."""

    name = "scripted"  # recordings label its commands "expert:<name>" (see `source`)
    gain = 10.0
    stall_window = 4  # steps without descending that count as contact
    stall_eps = 0.0008  # metres

    def __init__(self, noise_std: float = 0.0, seed: int = 0, mirrored: bool = False) -> None:
        if not (
            isinstance(noise_std, (int, float))
            and np.isfinite(noise_std)
            and 0.0 <= noise_std <= 1.0
        ):
            raise ValueError(f"noise_std must be in [0, 1], got {noise_std!r}")
        self.noise_std = float(noise_std)
        self.seed = int(seed)
        # A mirrored-mount arm (Variation.mount_mirrored): plans stay in the observations'
        # frame, commands are emitted in the arm's own frame (x/y negated).
        self.mirrored = bool(mirrored)
        self._episode = 0
        self.reset()

    # -- to be provided by subclasses
    phases: tuple[_Phase, ...] = ()

    def target(self, phase: _Phase, obs: dict[str, np.ndarray]) -> np.ndarray:
        """Base-frame position the grip site should reach in ``phase``."""
        raise NotImplementedError

    # -- machinery
    def reset(self) -> None:
        """Start a new episode (noise stream advances so episodes differ but stay seeded)."""
        self._rng = np.random.default_rng([self.seed, self._episode])
        self._episode += 1
        self._phase = 0
        self._steps_in_phase = 0
        self._z_history: list[float] = []
        self._memory: dict[str, np.ndarray] = {}
        self._last_move = np.zeros(3)

    @property
    def source(self) -> str:
        """What produced this expert's commands (ArmCommand.source, recording metadata)."""
        return f"expert:{self.name}"

    @property
    def phase_name(self) -> str:
        """Name of the current phase ('done' after the last one)."""
        return self.phases[self._phase].name if self._phase < len(self.phases) else "done"

    def act(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """4-D action for this observation."""
        for key in (EEF_POS, OBJECT_STATE):
            if key not in obs:
                raise ValueError(f"expert needs observation {key!r}; got keys {sorted(obs)}")
        eef = np.asarray(obs[EEF_POS], dtype=np.float64)
        if not self._memory:
            self._memory["start_eef"] = eef.copy()
            self.on_start(obs)
        # Advance through as many phases as are already satisfied.
        for _ in range(len(self.phases)):
            if self._phase >= len(self.phases):
                break
            phase = self.phases[self._phase]
            if not self._phase_done(phase, obs, eef):
                break
            self._phase += 1
            self._steps_in_phase = 0
            self._z_history = []
            self.on_phase_end(phase, obs)
        phase = self.phases[min(self._phase, len(self.phases) - 1)]
        goal = self.target(phase, obs)
        action = np.zeros(ACTION_DIM)
        desired = np.clip(self.gain * (goal - eef), -1.0, 1.0)
        # Rate-limit the command: jerky starts swing a held object out of the fingers.
        action[:3] = self._last_move + np.clip(desired - self._last_move, -phase.slew, phase.slew)
        self._last_move = action[:3].copy()
        action[3] = phase.gripper
        if self.noise_std > 0:
            action[:3] = np.clip(action[:3] + self._rng.normal(0.0, self.noise_std, 3), -1.0, 1.0)
        self._steps_in_phase += 1
        self._z_history.append(float(eef[2]))
        if self.mirrored:
            action[:2] *= -1.0
        return action.astype(np.float32)

    def _phase_done(self, phase: _Phase, obs: dict[str, np.ndarray], eef: np.ndarray) -> bool:
        if self._steps_in_phase < phase.min_steps:
            return False
        if self._steps_in_phase >= phase.max_steps:
            return True
        goal = self.target(phase, obs)
        err = goal - eef
        if np.linalg.norm(err[:2]) <= phase.xy_tol and abs(err[2]) <= phase.z_tol:
            return True
        if phase.stop_on_stall and len(self._z_history) >= self.stall_window + 2:
            recent = self._z_history[-self.stall_window :]
            if (
                max(recent) - min(recent) < self.stall_eps
                and np.linalg.norm(err[:2]) <= 2 * phase.xy_tol
            ):
                return True
        return False

    def on_start(self, obs: dict[str, np.ndarray]) -> None:
        """Hook: remember what the plan needs from the first observation."""

    def on_phase_end(self, phase: _Phase, obs: dict[str, np.ndarray]) -> None:
        """Hook: called when ``phase`` completes."""


class LiftExpert(ScriptedExpert):
    """Reach above the cube, descend, close, lift."""

    name = "lift_scripted"
    phases = (
        _Phase("approach", OPEN, xy_tol=0.008, z_tol=0.02),
        _Phase("descend", OPEN, xy_tol=0.01, z_tol=0.006, stop_on_stall=True, max_steps=60),
        _Phase("grasp", CLOSE, xy_tol=0.0, z_tol=0.0, min_steps=10, max_steps=10),
        _Phase("lift", CLOSE, xy_tol=0.0, z_tol=0.0, max_steps=10_000),
    )

    def target(self, phase: _Phase, obs: dict[str, np.ndarray]) -> np.ndarray:
        cube = _obj_pos(obs, 0)
        if phase.name == "approach":
            return cube + [0.0, 0.0, 0.08]
        if phase.name == "descend":
            return cube + [0.0, 0.0, -0.003]
        if phase.name == "grasp":
            return self._memory.get("grasp_at", cube)
        return self._memory["grasp_at"] + [0.0, 0.0, 0.2]

    def on_phase_end(self, phase: _Phase, obs: dict[str, np.ndarray]) -> None:
        if phase.name == "descend":
            self._memory["grasp_at"] = np.asarray(obs[EEF_POS], dtype=np.float64).copy()


class StackExpert(ScriptedExpert):
    """Pick cube A, carry it above cube B, lower it until contact, release, retreat."""

    name = "stack_scripted"
    phases = (
        _Phase("approach", OPEN, xy_tol=0.008, z_tol=0.02),
        _Phase("descend", OPEN, xy_tol=0.01, z_tol=0.006, stop_on_stall=True, max_steps=60),
        _Phase("grasp", CLOSE, min_steps=10, max_steps=10),
        _Phase("lift", CLOSE, xy_tol=0.02, z_tol=0.015),
        _Phase("carry", CLOSE, xy_tol=0.006, z_tol=0.015),
        _Phase("lower", CLOSE, xy_tol=0.01, z_tol=0.004, stop_on_stall=True, max_steps=80),
        _Phase("release", OPEN, min_steps=8, max_steps=8),
        _Phase("retreat", OPEN, xy_tol=0.0, z_tol=0.0, max_steps=10_000),
    )

    def on_start(self, obs: dict[str, np.ndarray]) -> None:
        # Object heights above their resting surface are unknown under size variation; the
        # carry height leaves room for the largest allowed cubes.
        self._memory["b0"] = _obj_pos(obs, 1).copy()

    def target(self, phase: _Phase, obs: dict[str, np.ndarray]) -> np.ndarray:
        a, b = _obj_pos(obs, 0), _obj_pos(obs, 1)
        if phase.name == "approach":
            return a + [0.0, 0.0, 0.08]
        if phase.name == "descend":
            return a + [0.0, 0.0, -0.003]
        if phase.name == "grasp":
            return self._memory.get("grasp_at", a)
        if phase.name == "lift":
            return np.array([*self._memory["grasp_at"][:2], b[2] + 0.12])
        # Hold the cube's offset from the grip site so cube A (not the hand) lines up with B.
        offset = self._memory["grasp_at"][:2] - self._memory["a_at_grasp"][:2]
        if phase.name == "carry":
            return np.array([*(b[:2] + offset), b[2] + 0.12])
        if phase.name == "lower":
            return np.array([*(b[:2] + offset), b[2] + 0.025])
        if phase.name == "release":
            return self._memory["release_at"]
        return self._memory["release_at"] + [0.0, 0.0, 0.12]

    def on_phase_end(self, phase: _Phase, obs: dict[str, np.ndarray]) -> None:
        eef = np.asarray(obs[EEF_POS], dtype=np.float64).copy()
        if phase.name == "descend":
            self._memory["grasp_at"] = eef
            self._memory["a_at_grasp"] = _obj_pos(obs, 0).copy()
        elif phase.name == "lower":
            self._memory["release_at"] = eef


class PickPlaceCanExpert(ScriptedExpert):
    """Pick the can, carry it above its target bin at a safe height, drop it, retreat."""

    name = "pick_place_can_scripted"
    carry_height = (
        0.22  # above the target bin floor: the hanging can (up to 1.2x) clears the bin walls
    )
    # Grip this far above the can's centre. The grip site cannot reach the centre (the fingers
    # meet the bin floor about 1 cm above it), so a descent aimed at the centre always ended
    # on a stall, and the close came after ``stall_window`` frames of pushing down against the
    # floor: frames a learned policy cannot tell from the pushing before them (its window saw
    # the same stalled state labelled "push, open"). Measured: BC policies then pushed at the
    # can with the gripper open for the whole episode (0-2/20 successes). A reachable grasp
    # point ends the descent on position (the eef->can vector), which the policy observes.
    grasp_above_centre = 0.015

    phases = (
        _Phase("approach", OPEN, xy_tol=0.008, z_tol=0.02),
        _Phase("descend", OPEN, xy_tol=0.01, z_tol=0.006, stop_on_stall=True, max_steps=60),
        _Phase("grasp", CLOSE, min_steps=12, max_steps=12),
        _Phase("lift", CLOSE, xy_tol=0.03, z_tol=0.02, slew=0.15),
        _Phase("carry", CLOSE, xy_tol=0.015, z_tol=0.03, max_steps=200, slew=0.15),
        _Phase("lower", CLOSE, xy_tol=0.02, z_tol=0.02, stop_on_stall=True, slew=0.15),
        _Phase("release", OPEN, min_steps=8, max_steps=8),
        _Phase("retreat", OPEN, xy_tol=0.0, z_tol=0.0, max_steps=10_000),
    )

    def target(self, phase: _Phase, obs: dict[str, np.ndarray]) -> np.ndarray:
        can = _obj_pos(obs, 0)
        goal = np.asarray(obs[OBJECT_STATE], dtype=np.float64)[OBJECT_STRIDE : OBJECT_STRIDE + 3]
        if phase.name == "approach":
            return can + [0.0, 0.0, 0.08]
        if phase.name == "descend":
            return can + [0.0, 0.0, self.grasp_above_centre]
        if phase.name == "grasp":
            return self._memory.get("grasp_at", can)
        if phase.name == "lift":
            return np.array([*self._memory["grasp_at"][:2], goal[2] + self.carry_height])
        if phase.name == "carry":
            return np.array([*goal[:2], goal[2] + self.carry_height])
        if phase.name == "lower":
            return np.array([*goal[:2], goal[2] + 0.09])
        if phase.name == "release":
            return self._memory["release_at"]
        return self._memory["release_at"] + [0.0, 0.0, 0.15]

    def on_phase_end(self, phase: _Phase, obs: dict[str, np.ndarray]) -> None:
        eef = np.asarray(obs[EEF_POS], dtype=np.float64).copy()
        if phase.name == "descend":
            self._memory["grasp_at"] = eef
        elif phase.name == "lower":
            self._memory["release_at"] = eef


_EXPERTS: dict[str, type[ScriptedExpert]] = {
    "lift": LiftExpert,
    "stack": StackExpert,
    "pick_place_can": PickPlaceCanExpert,
}


def make_expert(
    task: str,
    noise_std: float = 0.0,
    seed: int = 0,
    variation: "str | Variation | dict" = "default",
) -> ScriptedExpert:
    """Scripted expert for ``task`` with optional Gaussian action noise (seeded).

    ``variation`` is the arm's variation: a mirrored-mount arm gets its commands in its own
    frame, so the sim bridge, the expert driver and the robot node need nothing but it.
    """
    if task not in _EXPERTS:
        raise ValueError(f"no expert for task {task!r}; known: {sorted(_EXPERTS)}")
    mirrored = resolve_variation(variation).mount_mirrored
    return _EXPERTS[task](noise_std=noise_std, seed=seed, mirrored=mirrored)

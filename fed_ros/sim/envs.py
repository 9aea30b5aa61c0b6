"""Robosuite Panda arms with one 4-D action space, upright images and controlled variation.

``make_env(task, variation)`` builds a robosuite environment (Lift, PickPlaceCan or Stack)
with OSC position control, then wraps it in :class:`ArmEnv`, which

* validates actions (shape (4,), finite; values are clipped to [-1, 1]),
* returns observations under the keys of :mod:`fed_ros.core.data.episode` (positions and
  orientations in the robot base frame, object state zero-padded to 32),
* renders the agent-view and wrist cameras itself with ``mujoco.Renderer`` (upright
  images, shadows/reflections/multisampling off, EGL by default;
  :class:`~fed_ros.sim.camera_renderer.CameraRenderer`), and
* applies a :class:`~fed_ros.sim.variations.Variation` by editing the compiled MuJoCo
  model from saved originals (:class:`~fed_ros.sim.scene_edit.SceneEditor`; idempotent,
  soft resets keep it).
"""

from __future__ import annotations

import logging
import os

# MuJoCo picks its GL backend when it is first imported; EGL renders headless.
os.environ.setdefault("MUJOCO_GL", "egl")

from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

from fed_ros.core.data.episode import (
    ACTION_DIM,
    AGENTVIEW_IMAGE,
    EEF_POS,
    EEF_QUAT,
    GRIPPER_QPOS,
    JOINT_POS,
    OBJECT_STATE,
    OBJECT_STATE_DIM,
    WRIST_IMAGE,
)
from fed_ros.sim.camera_renderer import CameraRenderer, close_at_exit  # noqa: E402
from fed_ros.sim.scene_edit import SceneEditor  # noqa: E402
from fed_ros.sim.variations import (  # noqa: E402
    MATERIAL_COLOR_WORDS,
    VARIATIONS,
    Variation,
    random_variation,
    resolve_variation,
)

__all__ = [
    "TASKS",
    "TASK_SPECS",
    "VARIATIONS",
    "Variation",
    "random_variation",
    "resolve_variation",
    "ArmEnv",
    "make_env",
    "AGENTVIEW_CAMERA",
    "WRIST_CAMERA",
]

TASKS = ("lift", "pick_place_can", "stack")
AGENTVIEW_CAMERA = "agentview"
WRIST_CAMERA = "robot0_eye_in_hand"
CONTROL_HZ = 20


@dataclass(frozen=True)
class TaskSpec:
    """What differs between task families."""

    env_name: str  # robosuite environment class name
    horizon: int  # control steps before an episode times out
    default_colors: tuple[str, ...]  # colour words of the unvaried objects
    instruction: Callable[[tuple[str, ...]], str]


TASK_SPECS: dict[str, TaskSpec] = {
    "lift": TaskSpec("Lift", 200, ("red",), lambda c: f"lift the {c[0]} cube"),
    "pick_place_can": TaskSpec(
        "PickPlaceCan", 400, ("soda",), lambda c: f"pick up the {c[0]} can and place it in its bin"
    ),
    "stack": TaskSpec(
        "Stack", 400, ("red", "green"), lambda c: f"stack the {c[0]} cube on the {c[1]} cube"
    ),
}


def _controller_config() -> dict:
    """Panda with a 4-D OSC position controller (3 deltas in the base frame + gripper)."""
    from robosuite.controllers import load_composite_controller_config, load_part_controller_config

    cfg = load_composite_controller_config(controller="BASIC", robot="Panda")
    arm = load_part_controller_config(default_controller="OSC_POSITION")
    arm["gripper"] = {"type": "GRIP"}
    # Only the one arm the Panda has; extra parts make robosuite warn on every reset.
    cfg["body_parts"] = {"right": arm}
    return cfg


def _quat_wxyz_to_xyzw(q: np.ndarray) -> np.ndarray:
    return np.array([q[1], q[2], q[3], q[0]], dtype=np.float64)


def _mat_to_quat_xyzw(mat: np.ndarray) -> np.ndarray:
    import mujoco

    q = np.empty(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(mat, dtype=np.float64).reshape(9))
    if q[0] < 0:  # one hemisphere, so equal rotations give equal observations
        q = -q
    return _quat_wxyz_to_xyzw(q)


class ArmEnv:
    """One simulated Panda arm running one task under one variation.

    Not thread-safe: step, reset and render it from one thread at a time (the bridge node
    serialises calls). Independent instances may live side by side in one process.
    """

    control_hz: int = CONTROL_HZ

    def __init__(
        self,
        task: str,
        variation: "str | Variation" = "default",
        cameras: bool = True,
        image_size: int = 84,
        seed: int = 0,
        horizon: int | None = None,
    ) -> None:
        if not isinstance(task, str) or task not in TASK_SPECS:
            raise ValueError(f"unknown task {task!r}; known: {list(TASKS)}")
        if not isinstance(image_size, (int, np.integer)) or not 16 <= image_size <= 1024:
            raise ValueError(f"image_size must be an int in [16, 1024], got {image_size!r}")
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if horizon is not None and (not isinstance(horizon, (int, np.integer)) or horizon <= 0):
            raise ValueError(f"horizon must be a positive int, got {horizon!r}")
        self.task = task
        self.spec = TASK_SPECS[task]
        self.cameras = bool(cameras)
        self.image_size = int(image_size)
        self.horizon = int(horizon or self.spec.horizon)
        self._variation = resolve_variation(variation)

        import robosuite

        # robosuite logs every controller load and reset at INFO/WARNING; keep errors only.
        logging.getLogger("robosuite_logs").setLevel(logging.ERROR)
        # The robosuite env never renders: ArmEnv owns the renderer (upright, fast settings).
        self._env = robosuite.make(
            self.spec.env_name,
            robots="Panda",
            controller_configs=_controller_config(),
            has_renderer=False,
            has_offscreen_renderer=False,
            use_camera_obs=False,
            use_object_obs=True,
            reward_shaping=False,
            control_freq=CONTROL_HZ,
            horizon=self.horizon,
            ignore_done=True,
            hard_reset=False,
            seed=int(seed),
        )
        self._sim = self._env.sim
        self._model = self._sim.model._model  # raw mujoco.MjModel
        self._data = self._sim.data._data
        robot = self._env.robots[0]
        self._robot = robot
        self.joint_names: list[str] = list(robot.robot_joints)
        self.gripper_joint_names: list[str] = list(robot.gripper_joints["right"])
        self._arm_qpos = np.array(
            [self._sim.model.get_joint_qpos_addr(j) for j in self.joint_names]
        )
        self._grip_qpos = np.array(
            [self._sim.model.get_joint_qpos_addr(j) for j in self.gripper_joint_names]
        )
        self._eef_site = int(robot.eef_site_id["right"])
        self._base_body = self._sim.model.body_name2id(robot.robot_model.root_body)
        self._scene = SceneEditor(self._env, task, camera=AGENTVIEW_CAMERA)
        self._objects, self._object_bodies = self._scene.objects, self._scene.object_bodies
        self._camera_renderer = CameraRenderer(
            self._model, self._data, self.image_size, (AGENTVIEW_CAMERA, WRIST_CAMERA)
        )
        self._steps = 0
        self._last_obs: dict[str, np.ndarray] | None = None
        self._closed = False
        close_at_exit(self)
        self._apply_variation(self._variation)
        self.reset(seed=int(seed))

    # ------------------------------------------------------------------ public API
    @property
    def variation(self) -> Variation:
        """The variation in effect."""
        return self._variation

    @property
    def instruction(self) -> str:
        """Language instruction; object colour words follow the variation."""
        v = self._variation
        colours = list(self.spec.default_colors)
        for i in range(len(colours)):
            if i < len(v.object_colors):
                colours[i] = v.object_colors[i]
            elif v.object_material is not None:
                colours[i] = MATERIAL_COLOR_WORDS[v.object_material]
        return self.spec.instruction(tuple(colours))

    @property
    def steps(self) -> int:
        """Control steps taken since the last reset."""
        return self._steps

    @property
    def raw_env(self) -> Any:
        """The wrapped robosuite environment (for advanced use; do not step it directly)."""
        return self._env

    def set_variation(self, variation: "str | Variation") -> None:
        """Switch the scene's variation (takes effect now; call reset() for a fresh episode)."""
        self._check_open()
        self._variation = resolve_variation(variation)
        self._apply_variation(self._variation)

    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        """Start an episode; a given seed fixes robot noise and object placement exactly."""
        self._check_open()
        if seed is not None:
            if not isinstance(seed, (int, np.integer)) or seed < 0:
                raise ValueError(f"seed must be a non-negative int, got {seed!r}")
            # Re-seed in place: robosuite's placement samplers hold this same Generator.
            self._env.rng.bit_generator.state = np.random.default_rng(int(seed)).bit_generator.state
        self._env.reset()
        self._steps = 0
        self._last_obs = self._observe()
        return self._last_obs

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], bool, bool]:
        """Apply one 4-D action for 1/control_hz s; returns (obs, done, success).

        ``done`` is True on success (episodes terminate on success) or at the horizon.
        """
        self._check_open()
        act = self.check_action(action)
        if self._variation.mount_mirrored:
            act[:2] *= -1.0  # the arm's own x/y point the opposite way in the work-cell frame
        self._env.step(act)
        self._steps += 1
        success = bool(self._env._check_success())
        done = success or self._steps >= self.horizon
        self._last_obs = self._observe()
        return self._last_obs, done, success

    @staticmethod
    def check_action(action: Any) -> np.ndarray:
        """Validated copy of an action: shape (4,), finite; clipped to [-1, 1]."""
        try:
            arr = np.asarray(action, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"action must be numeric with shape ({ACTION_DIM},), got {action!r}"
            ) from exc
        if arr.shape != (ACTION_DIM,):
            raise ValueError(f"action must have shape ({ACTION_DIM},), got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"action contains NaN/Inf: {arr.tolist()}")
        return np.clip(arr, -1.0, 1.0)

    def success(self) -> bool:
        """Whether the task is currently solved."""
        return bool(self._env._check_success())

    def render(self, camera: str = AGENTVIEW_CAMERA, size: int | None = None) -> np.ndarray:
        """Upright HxWx3 uint8 image from a named camera (works with cameras=False too)."""
        self._check_open()
        if size is not None and size != self.image_size:
            return self._camera_renderer.render_at(camera, int(size))
        return self._camera_renderer.render(camera)

    def close(self) -> None:
        """Free the renderer and the simulator (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._camera_renderer.close()
        try:
            self._env.close()
        except Exception:  # robosuite's close may touch renderers that were never created
            pass

    def __enter__(self) -> "ArmEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ observations
    def object_positions(self) -> dict[str, np.ndarray]:
        """World-frame positions of task objects and targets (what experts plan with)."""
        d = self._data
        out = {obj.name: d.xpos[b].copy() for obj, b in zip(self._objects, self._object_bodies)}
        if self.task == "pick_place_can":
            out["target"] = np.array(
                self._env.target_bin_placements[self._env.object_to_id["can"]], dtype=float
            )
        return out

    def _to_base(self, p: np.ndarray) -> np.ndarray:
        return self._base_rot.T @ (p - self._base_pos)

    def _observe(self) -> dict[str, np.ndarray]:
        d = self._data
        self._base_pos = d.xpos[self._base_body].copy()
        self._base_rot = d.xmat[self._base_body].reshape(3, 3).copy()
        eef_world = d.site_xpos[self._eef_site].copy()
        eef_rot = self._base_rot.T @ d.site_xmat[self._eef_site].reshape(3, 3)
        obs: dict[str, np.ndarray] = {
            JOINT_POS: d.qpos[self._arm_qpos].astype(np.float32),
            GRIPPER_QPOS: d.qpos[self._grip_qpos].astype(np.float32),
            EEF_POS: self._to_base(eef_world).astype(np.float32),
            EEF_QUAT: _mat_to_quat_xyzw(eef_rot).astype(np.float32),
            OBJECT_STATE: self._object_state(eef_world),
        }
        if self.cameras:
            obs[AGENTVIEW_IMAGE] = self._camera_renderer.render(AGENTVIEW_CAMERA)
            obs[WRIST_IMAGE] = self._camera_renderer.render(WRIST_CAMERA)
        return obs

    def _object_state(self, eef_world: np.ndarray) -> np.ndarray:
        """Per object: position, quaternion (xyzw), eef->object vector, all in the base frame.

        Stack appends cubeA->cubeB; PickPlaceCan appends the target bin position.
        """
        d = self._data
        parts: list[np.ndarray] = []
        positions = []
        for body in self._object_bodies:
            pos = d.xpos[body]
            rot = self._base_rot.T @ d.xmat[body].reshape(3, 3)
            positions.append(pos)
            parts += [
                self._to_base(pos),
                _mat_to_quat_xyzw(rot),
                self._base_rot.T @ (pos - eef_world),
            ]
        if self.task == "stack":
            parts.append(self._base_rot.T @ (positions[1] - positions[0]))
        elif self.task == "pick_place_can":
            parts.append(self._to_base(self.object_positions()["target"]))
        flat = np.concatenate(parts).astype(np.float32)
        out = np.zeros(OBJECT_STATE_DIM, dtype=np.float32)
        out[: flat.size] = flat
        return out

    # ------------------------------------------------------------------ scene
    def _apply_variation(self, v: Variation) -> None:
        self._scene.apply(v)
        # Mesh vertices are uploaded when a GL context is made: rebuild the renderer.
        self._camera_renderer.rebuild()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("environment is closed")


def make_env(
    task: str,
    variation: "str | Variation" = "default",
    cameras: bool = True,
    image_size: int = 84,
    seed: int = 0,
    horizon: int | None = None,
) -> ArmEnv:
    """Build an :class:`ArmEnv` for ``task`` in :data:`TASKS` under a named or given variation."""
    return ArmEnv(
        task,
        variation=variation,
        cameras=cameras,
        image_size=image_size,
        seed=seed,
        horizon=horizon,
    )

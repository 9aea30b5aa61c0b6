"""Offscreen camera images of a MuJoCo scene: upright, at fast settings, headless by default.

An :class:`~fed_ros.sim.envs.ArmEnv` observes through cameras, but drawing them is a concern
of its own: a GL context sized to the image, EGL when MuJoCo picked GLFW at import on a machine
without a display, shadows/reflections/skybox/multisampling off, collision geoms hidden, camera
ids resolved by name once, a one-off context for another image size, and contexts freed at exit
before MuJoCo tears down the EGL display. None of that depends on the task or the robot, so it
lives here apart from physics and observation assembly.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any

import numpy as np

# GL contexts must be freed before MuJoCo's own exit hook terminates the EGL display, or
# their finalisers raise at exit. atexit runs hooks last-registered-first, so ours is
# registered after the first renderer exists (i.e. after MuJoCo registered its hook).
_CLOSE_AT_EXIT: "weakref.WeakSet[Any]" = weakref.WeakSet()
_EXIT_HOOK_REGISTERED = False


def close_at_exit(owner: Any) -> None:
    """Have ``owner.close()`` (the owner of a :class:`CameraRenderer`) run at interpreter exit,
    before MuJoCo's own exit hook; held weakly, so an owner collected earlier is skipped."""
    _CLOSE_AT_EXIT.add(owner)


def _close_registered() -> None:
    for owner in list(_CLOSE_AT_EXIT):
        try:
            owner.close()
        except Exception:  # at exit there is nobody left to report to
            pass


def _register_exit_hook() -> None:
    global _EXIT_HOOK_REGISTERED
    if not _EXIT_HOOK_REGISTERED:
        atexit.register(_close_registered)
        _EXIT_HOOK_REGISTERED = True


def _ensure_headless_gl() -> None:
    """Use EGL when MuJoCo was imported before MUJOCO_GL was set and there is no display.

    MuJoCo picks its GL backend at import; without MUJOCO_GL it picks GLFW, which cannot
    open a context on a headless machine. An explicit MUJOCO_GL choice is always respected.
    """
    from mujoco import gl_context

    headless = sys.platform.startswith("linux") and not os.environ.get("DISPLAY")
    if headless and getattr(gl_context, "_MUJOCO_GL", None) == "":
        from mujoco.egl import GLContext as EGLContext

        gl_context.GLContext = EGLContext


class CameraRenderer:
    """Square upright HxWx3 uint8 images of a raw ``mujoco.MjModel``/``MjData`` pair's cameras.

    The GL context is made on the first render, not before; ``cameras`` are the names whose ids
    are looked up when it is made (others are looked up on first use). Not thread-safe.
    """

    def __init__(self, model: Any, data: Any, image_size: int, cameras: tuple[str, ...]) -> None:
        self._model, self._data = model, data
        self.image_size = int(image_size)
        self._cameras = tuple(cameras)
        self._renderer: Any = None
        self._vopt: Any = None
        self._camera_ids: dict[str, int] = {}

    def _make(self) -> None:
        import mujoco

        _ensure_headless_gl()
        # Multisampling is the costliest part of software GL; read when the context is made.
        self._model.vis.quality.offsamples = 0
        if self._renderer is not None:
            self._renderer.close()
        self._renderer = mujoco.Renderer(self._model, height=self.image_size, width=self.image_size)
        _register_exit_hook()
        flags = self._renderer.scene.flags
        flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = 0
        self._vopt = mujoco.MjvOption()
        # robosuite puts collision geoms in group 0 and visual geoms in group 1.
        self._vopt.geomgroup[0] = 0
        self._camera_ids = {
            name: mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_CAMERA, name)
            for name in self._cameras
        }

    def render(self, camera: str) -> np.ndarray:
        """The named camera's image at ``image_size``; ValueError for an unknown camera."""
        if self._renderer is None:
            self._make()
        cam_id = self._camera_ids.get(camera)
        if cam_id is None:
            import mujoco

            cam_id = mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if cam_id < 0:
                raise ValueError(f"unknown camera {camera!r}")
            self._camera_ids[camera] = cam_id
        self._renderer.update_scene(self._data, camera=cam_id, scene_option=self._vopt)
        # mujoco.Renderer already flips rows, so row 0 is the top of the image.
        return self._renderer.render().copy()

    def render_at(self, camera: str, size: int) -> np.ndarray:
        """One image at another size, from a context made for it and freed at once."""
        saved = (self._renderer, self.image_size)
        self._renderer, self.image_size = None, size
        try:
            return self.render(camera)
        finally:
            if self._renderer is not None:
                self._renderer.close()
            self._renderer, self.image_size = saved

    def rebuild(self) -> None:
        """Remake an existing context: mesh vertices are uploaded only when one is made."""
        if self._renderer is not None:
            self._make()

    def close(self) -> None:
        """Free the GL context (idempotent; a later render makes a new one)."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

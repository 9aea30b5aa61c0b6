"""The arm adapter's homing: send the home trajectory and wait until the arm is there.

The mechanics of a reset, with explicit collaborators: the arm's command output (which sends
the trajectory), the profile (home pose, duration, tolerance) and a reader of the newest joint
positions with the count of joint-state messages so far. The adapter's ResetEpisode service
(:mod:`fed_ros.ros.nodes.arm_adapter.reset`) does the episode bookkeeping around it.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from fed_ros.core.arm.profile import ArmProfile

# Joint states received after the trajectory, all within tolerance: the arm (or simulator) has
# acted on it (one could be a state published before the trajectory arrived).
FRESH_STATES = 3


def home_timeout_s(profile: ArmProfile) -> float:
    """How long homing may take: twice the trajectory's duration plus 5 s of slack."""
    return 2.0 * profile.joints.home_duration_s + 5.0


def go_home(
    send_home: Callable[[], None],
    profile: ArmProfile,
    joints_now: Callable[[], tuple[np.ndarray | None, int]],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Send the home trajectory and wait for the arm: '' once it is home, else why not.

    ``joints_now()`` returns (the fresh joint positions or None, joint-state messages so far).
    """
    _, seen = joints_now()
    send_home()
    joints_cfg = profile.joints
    home, tolerance = np.asarray(joints_cfg.home), joints_cfg.home_tolerance_rad
    deadline = clock() + home_timeout_s(profile)
    error = np.full(len(joints_cfg.names), np.inf)
    while clock() < deadline:
        joints, count = joints_now()
        if joints is not None:
            error = np.abs(joints - home)
            if count - seen >= FRESH_STATES and np.all(error <= tolerance):
                return ""
        sleep(profile.period_s / 2)
    far = {n: round(float(e), 3) for n, e in zip(joints_cfg.names, error) if not e <= tolerance}
    return (
        f"arm did not reach home within {home_timeout_s(profile):g} s "
        f"(|error| rad above {tolerance:g}: {far})"
    )

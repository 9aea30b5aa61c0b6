"""The arm adapter's state store and the observation built from it (ROS-free)."""

from __future__ import annotations

import numpy as np

from fed_ros.core.arm.state import ArmStateStore, observation_from_state


def _store(now: list[float]) -> ArmStateStore:
    return ArmStateStore(state_timeout_s=0.5, lockstep=False, clock=lambda: now[0])


def test_observation_is_none_while_the_fingers_are_stale():
    """The fingers are a needed part like the joints and the pose: found by mypy (indexing a
    value that may be None); before, a stale fingers sample raised TypeError."""
    now = [0.0]
    store = _store(now)
    store.put("fingers", (np.zeros(2), np.zeros(2)))
    now[0] = 0.4
    store.put("joints", (np.zeros(7), np.zeros(7)))
    store.put("pose", (np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0])))
    now[0] = 0.6  # the fingers came 0.6 s ago: stale; the joints and pose are fresh
    assert observation_from_state(store, now[0], False, {}, ()) is None


def test_observation_from_fresh_parts():
    now = [0.0]
    store = _store(now)
    store.put("fingers", (np.ones(2), np.zeros(2)))
    store.put("joints", (np.zeros(7), np.zeros(7)))
    store.put("pose", (np.zeros(3), np.array([0.0, 0.0, 0.0, 1.0])))
    obs = observation_from_state(store, 0.1, False, {}, ())
    assert obs is not None
    assert obs["gripper_qpos"].tolist() == [1.0, 1.0]
    assert obs["object_state"].shape == (32,)

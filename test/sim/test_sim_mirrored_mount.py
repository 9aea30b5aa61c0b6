"""The mirrored-mount variation: the simulator negates commanded x/y, the scripted expert for
such an arm commands in the arm's frame, and its demonstrations are the benchmark's
mirrored family (the normal arm's with x/y negated, same observations)."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.sim.variations import VARIATIONS, Variation, resolve_variation


def test_mirrored_mount_preset_and_validation():
    assert resolve_variation("mirrored_mount").mount_mirrored is True
    assert not any(v.mount_mirrored for name, v in VARIATIONS.items() if name != "mirrored_mount")
    assert (
        Variation.from_dict(VARIATIONS["mirrored_mount"].to_dict()) == VARIATIONS["mirrored_mount"]
    )
    with pytest.raises(ValueError, match="mount_mirrored"):
        Variation(name="bad", mount_mirrored="yes")


def test_mirrored_expert_commands_in_the_arm_frame():
    from fed_ros.sim.experts import make_expert

    obs = {
        "eef_pos": np.array([0.0, 0.0, 1.0]),
        "object_state": np.zeros(30),
        "gripper_qpos": np.zeros(2),
    }
    obs["object_state"][:3] = [0.05, -0.03, 0.82]
    normal = make_expert("lift").act(obs)
    mirrored = make_expert("lift", variation="mirrored_mount").act(obs)
    assert np.any(normal[:2] != 0)
    np.testing.assert_array_equal(mirrored[:2], -normal[:2])
    np.testing.assert_array_equal(mirrored[2:], normal[2:])
    assert make_expert("lift").source == "expert:lift_scripted"


def test_mirrored_demos_are_the_benchmark_mirror_of_normal_demos():
    from fed_ros.bench.federation.demos import mirror_episode
    from fed_ros.sim.collect import collect_demos

    normal = collect_demos("lift", "default", n=2, seed=7, cameras=False)
    mirrored = collect_demos("lift", "mirrored_mount", n=2, seed=7, cameras=False)
    for a, b in zip(normal, mirrored):
        assert a.success and b.success and b.metadata["source"] == "expert:lift_scripted"
        expected = mirror_episode(a)
        np.testing.assert_allclose(b.actions, expected.actions, atol=1e-6)
        for key in ("eef_pos", "object_state", "joint_pos"):
            np.testing.assert_allclose(b.observations[key], a.observations[key], atol=1e-6)

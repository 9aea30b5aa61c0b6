"""PolicyConfig.use_object_state (issue 18 item 5): real arms train without object_state.

ROS-free: an image policy with use_object_state=False has no object-state token and its
action does not depend on object_state; with True it has one and does; the low-dim policy
rejects False; the defaults keep the existing manifests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fed_ros.core.data import episode as ep
from fed_ros.learning.configuration_policy import IMAGE_MODALITIES, LOWDIM_MODALITIES, PolicyConfig
from fed_ros.learning.dataset import DemoDataset, synthetic_episodes
from fed_ros.learning.modeling_policy import build_policy

SMALL = dict(
    kind="image",
    image_size=32,
    window=2,
    embed_dim=32,
    text_dim=32,
    transformer_ff=64,
    num_keypoints=8,
    dropout=0.0,
)


def _obs(object_state: np.ndarray) -> dict:
    rng = np.random.default_rng(3)
    return {
        "instruction": "lift the cube",
        ep.AGENTVIEW_IMAGE: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
        ep.WRIST_IMAGE: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
        ep.JOINT_POS: rng.normal(size=7).astype(np.float32),
        ep.GRIPPER_QPOS: np.array([0.02, -0.02], np.float32),
        ep.EEF_POS: np.array([0.5, 0.0, 0.9], np.float32),
        ep.EEF_QUAT: np.array([0.0, 0.0, 0.0, 1.0], np.float32),
        ep.OBJECT_STATE: object_state.astype(np.float32),
    }


def _action(cfg: PolicyConfig, object_state: np.ndarray) -> np.ndarray:
    model = build_policy(cfg, seed=1).eval()
    model.reset()
    return model.select_action(_obs(object_state))


def test_defaults_keep_the_existing_manifests() -> None:
    image, lowdim = PolicyConfig(kind="image"), PolicyConfig(kind="lowdim")
    assert image.use_object_state is False and lowdim.use_object_state is True
    assert image.modalities == IMAGE_MODALITIES and lowdim.modalities == LOWDIM_MODALITIES
    assert image == PolicyConfig(kind="image", use_object_state=False)
    # A checkpoint's config written before the field existed still loads to the same policy.
    old = {k: v for k, v in image.to_dict().items() if k != "use_object_state"}
    assert PolicyConfig.from_dict(old) == image
    names = set(build_policy(PolicyConfig(**SMALL), seed=0).state_dict())
    assert not any(n.startswith("object_encoder.") for n in names)


def test_image_policy_without_object_state_ignores_it() -> None:
    cfg = PolicyConfig(**SMALL, use_object_state=False)
    assert "object" not in cfg.modalities
    zeros = np.zeros(ep.OBJECT_STATE_DIM)
    other = np.random.default_rng(0).normal(size=ep.OBJECT_STATE_DIM) * 5.0
    np.testing.assert_array_equal(_action(cfg, zeros), _action(cfg, other))
    # No object_state at all (a real arm without perception) is fine too.
    obs = _obs(zeros)
    del obs[ep.OBJECT_STATE]
    model = build_policy(cfg, seed=1).eval()
    np.testing.assert_array_equal(model.select_action(obs), _action(cfg, zeros))
    # ... and so is training data without it.
    episodes = synthetic_episodes(2, length=6, kind="image", image_size=32)
    for e in episodes:
        del e.observations[ep.OBJECT_STATE]
    batch = DemoDataset(episodes, cfg).torch_batch(np.arange(4))
    assert ep.OBJECT_STATE not in batch
    loss, _ = model.train()(batch)
    assert torch.isfinite(loss)


def test_image_policy_with_object_state_uses_it() -> None:
    cfg = PolicyConfig(**SMALL, use_object_state=True)
    assert cfg.modalities == ("text", "agentview", "wrist", "object", "joint", "gripper")
    assert any(n.startswith("object_encoder.") for n in build_policy(cfg, seed=0).state_dict())
    zeros = np.zeros(ep.OBJECT_STATE_DIM)
    other = np.random.default_rng(0).normal(size=ep.OBJECT_STATE_DIM) * 5.0
    assert not np.array_equal(_action(cfg, zeros), _action(cfg, other))
    episodes = synthetic_episodes(1, length=4, kind="image", image_size=32)
    del episodes[0].observations[ep.OBJECT_STATE]
    with pytest.raises(ValueError, match="object_state"):
        DemoDataset(episodes, cfg)


def test_lowdim_policy_needs_object_state() -> None:
    with pytest.raises(ValueError, match="use_object_state=False needs kind='image'"):
        PolicyConfig(kind="lowdim", use_object_state=False)
    with pytest.raises(ValueError, match="must be a bool"):
        PolicyConfig(kind="image", use_object_state="no")

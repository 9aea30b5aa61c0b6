"""PolicyConfig.use_eef_state: an image policy that also reads the end-effector pose.

ROS-free: the defaults keep the existing manifests (image: no eef token; low-dim: always one);
an image policy with use_eef_state=True has an eef token whose input moves its action and
trains from episodes that carry eef_pos/eef_quat (and refuses episodes without them); without
it the eef pose is ignored; the low-dim policy rejects False.
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


def _obs(eef_pos: np.ndarray) -> dict:
    rng = np.random.default_rng(3)
    return {
        "instruction": "lift the cube",
        ep.AGENTVIEW_IMAGE: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
        ep.WRIST_IMAGE: rng.integers(0, 255, (32, 32, 3), dtype=np.uint8),
        ep.JOINT_POS: rng.normal(size=7).astype(np.float32),
        ep.GRIPPER_QPOS: np.array([0.02, -0.02], np.float32),
        ep.EEF_POS: eef_pos.astype(np.float32),
        ep.EEF_QUAT: np.array([0.0, 0.0, 0.0, 1.0], np.float32),
    }


def _action(cfg: PolicyConfig, eef_pos: np.ndarray) -> np.ndarray:
    model = build_policy(cfg, seed=1).eval()
    model.reset()
    return model.select_action(_obs(eef_pos))


HERE, THERE = np.array([0.5, 0.0, 0.9]), np.array([0.3, 0.2, 1.1])


def test_defaults_keep_the_existing_manifests() -> None:
    image, lowdim = PolicyConfig(kind="image"), PolicyConfig(kind="lowdim")
    assert image.use_eef_state is False and lowdim.use_eef_state is True
    assert image.modalities == IMAGE_MODALITIES and lowdim.modalities == LOWDIM_MODALITIES
    # A checkpoint's config written before the field existed still loads to the same policy.
    for cfg in (image, lowdim):
        old = {k: v for k, v in cfg.to_dict().items() if k != "use_eef_state"}
        assert PolicyConfig.from_dict(old) == cfg
    names = set(build_policy(PolicyConfig(**SMALL), seed=0).state_dict())
    assert not any(n.startswith("eef_encoder.") for n in names)
    # Without the token the eef pose is ignored.
    np.testing.assert_array_equal(
        _action(PolicyConfig(**SMALL), HERE), _action(PolicyConfig(**SMALL), THERE)
    )


def test_image_policy_with_eef_state_reads_and_trains_on_it() -> None:
    cfg = PolicyConfig(**SMALL, use_eef_state=True)
    assert cfg.modalities == ("text", "agentview", "wrist", "eef", "joint", "gripper")
    assert PolicyConfig(**SMALL, use_eef_state=True, use_object_state=True).modalities == (
        "text", "agentview", "wrist", "object", "eef", "joint", "gripper",
    )  # fmt: skip
    assert any(n.startswith("eef_encoder.") for n in build_policy(cfg, seed=0).state_dict())
    assert not np.array_equal(_action(cfg, HERE), _action(cfg, THERE))
    episodes = synthetic_episodes(2, length=6, kind="image", image_size=32)
    batch = DemoDataset(episodes, cfg).torch_batch(np.arange(4))
    assert ep.EEF_POS in batch and ep.EEF_QUAT in batch
    model = build_policy(cfg, seed=0).train()
    loss, _ = model(batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.eef_encoder[0].weight.grad.abs().sum() > 0
    # A recording without the pose is refused by name, not trained on zeros.
    del episodes[0].observations[ep.EEF_QUAT]
    with pytest.raises(ValueError, match="eef_quat"):
        DemoDataset(episodes, cfg)
    obs = _obs(HERE)
    del obs[ep.EEF_POS]
    with pytest.raises(ValueError, match="eef_pos"):
        build_policy(cfg, seed=1).select_action(obs)


def test_lowdim_policy_needs_eef_state() -> None:
    with pytest.raises(ValueError, match="use_eef_state=False needs kind='image'"):
        PolicyConfig(kind="lowdim", use_eef_state=False)
    with pytest.raises(ValueError, match="use_eef_state must be a bool"):
        PolicyConfig(kind="image", use_eef_state=1)

"""Client descriptors for clustering: FeDepth Gaussian and policy embeddings (RND: rnd_descriptor).

Everything that must be comparable across robots is derived from fleet-wide seeds (frozen
encoders, RND target) and from the data only, computed in float64 on the CPU, so identical
data give bit-identical descriptors on every robot.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn

from fed_ros.core.data import episode as ep
from fed_ros.core.data.episode import Episode
from fed_ros.learning.configuration_policy import PolicyConfig

DESCRIPTOR_SEED = 7_001  # fleet-wide: the frozen descriptor encoder
LOWDIM_STATE_KEYS = (ep.OBJECT_STATE, ep.EEF_POS, ep.EEF_QUAT, ep.JOINT_POS, ep.GRIPPER_QPOS)
LOWDIM_STATE_DIM = ep.OBJECT_STATE_DIM + 3 + 4 + 7 + 2


def _kaiming_(module: nn.Module, gen: torch.Generator) -> nn.Module:
    """Initialise conv/linear weights from ``gen`` only (independent of the global RNG)."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            with torch.no_grad():
                m.weight.copy_(
                    torch.randn(m.weight.shape, generator=gen, dtype=m.weight.dtype)
                    * (2.0 / fan_in) ** 0.5
                )
                if m.bias is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen, dtype=m.bias.dtype))
    return module


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


def _detect_mode(episodes: Sequence[Episode], policy_cfg: PolicyConfig | None) -> str:
    if policy_cfg is not None:
        return policy_cfg.kind
    has_images = all(ep.AGENTVIEW_IMAGE in e.observations for e in episodes)
    return "image" if has_images else "lowdim"


def _sample_frames(episodes: Sequence[Episode], n: int | None, seed: int) -> list[tuple[int, int]]:
    """(episode, step) pairs: all frames, or ``n`` drawn without replacement (sorted)."""
    pairs = [(i, t) for i, e in enumerate(episodes) for t in range(len(e))]
    if not pairs:
        raise ValueError("no frames: episodes are empty")
    if n is None or n >= len(pairs):
        return pairs
    pick = np.sort(np.random.default_rng(seed).choice(len(pairs), size=n, replace=False))
    return [pairs[i] for i in pick]


def _gather(
    episodes: Sequence[Episode],
    frames: list[tuple[int, int]],
    mode: str,
    image_key: str = ep.AGENTVIEW_IMAGE,
) -> torch.Tensor:
    """Inputs as float64: images (n,3,H,W) in [0,1] or low-dim states (n, LOWDIM_STATE_DIM)."""
    if mode == "image":
        for i, e in enumerate(episodes):
            if image_key not in e.observations:
                raise ValueError(
                    f"episode {i} ({e.task!r}) lacks {image_key!r} for an image descriptor"
                )
        imgs = np.stack([episodes[i].observations[image_key][t] for i, t in frames])
        if imgs.ndim != 4 or imgs.shape[-1] != 3:
            raise ValueError(f"{image_key} frames must be HxWx3, got {imgs.shape[1:]}")
        return torch.from_numpy(imgs).permute(0, 3, 1, 2).double() / 255.0
    if mode != "lowdim":
        raise ValueError(f"descriptor mode must be 'image' or 'lowdim', got {mode!r}")
    rows = []
    for i, t in frames:
        obs = episodes[i].observations
        missing = [k for k in LOWDIM_STATE_KEYS if k not in obs]
        if missing:
            raise ValueError(f"episode {i} lacks {missing[0]!r} for a low-dim descriptor")
        rows.append(
            np.concatenate(
                [np.asarray(obs[k][t], np.float64).reshape(-1) for k in LOWDIM_STATE_KEYS]
            )
        )
    x = np.stack(rows)
    if x.shape[1] != LOWDIM_STATE_DIM:
        raise ValueError(f"low-dim state has {x.shape[1]} values, expected {LOWDIM_STATE_DIM}")
    return torch.from_numpy(x)


# ---------------------------------------------------------------------------------------
# FeDepth Gaussian descriptor
#
# The Jeffreys divergence between diagonal Gaussians sums (var_a + d^2) / var_b over channels,
# so one channel whose variance is ~0 in one robot dominates the whole matrix. Two choices
# keep every channel informative and on one scale:
# * low-dim states are divided by FIXED physical scales (below; the same on every robot, so
#   identical data still give identical descriptors) and mapped by random Fourier features
#   cos(W x + b): bounded, never dead (no ReLU half-space), and the channel means form a
#   kernel mean embedding of the state distribution, so they move with the data distribution;
# * the variance floor is a fixed fraction of each encoder's nominal feature power, not an
#   absolute 1e-8, so near-constant channels cannot produce variance ratios of 1e4.

# Fixed scales of the 53-d low-dim state (LOWDIM_STATE_KEYS order): roughly the spread of
# each quantity within one work cell. Positions and vectors in metres (5 cm: the scale of
# object placement and of one reach), quaternion components 0.5, joints 0.25 rad, fingers 1 cm.
# They are not fitted to any data set (per-robot statistics would make descriptors of
# different robots incomparable).
POSITION_SCALE_M = 0.05
QUAT_SCALE = 0.5
JOINT_SCALE_RAD = 0.25
GRIPPER_SCALE_M = 0.01
# Random Fourier feature bandwidth on the scaled state: w ~ N(0, 1/L^2). With ~10-20 state
# entries varying by ~1 scale unit, w.x varies by about 1 rad, so features neither saturate
# into noise (too high a frequency) nor stay constant (too low).
RFF_LENGTHSCALE = 4.0
# Variance floor = a fixed fraction of the nominal per-channel feature power (0.5 for a
# random-phase cosine; the image encoder's is measured on a fixed reference image), so every
# robot uses the same floor and one channel's Jeffreys term is bounded by d^2 / floor.
# Low-dim: Fourier channels of one robot's Lift demos have variances of 6-73 % of their power
# (10th-90th percentile), so 1 % only lifts channels that barely move. Images: GeM features of
# a mostly static scene vary by ~1e-4 of their power from frame to frame (synthetic test
# images) while dead channels have exactly 0 variance, so the floor sits at 1e-4 (1 % would
# flatten every channel).
VARIANCE_FLOOR_FRACTION = {"lowdim": 1e-2, "image": 1e-4}
MIN_VARIANCE = 1e-8  # absolute lower bound on top of the relative floor (variances > 0, V5)


def lowdim_state_scale(
    length_m: float = POSITION_SCALE_M,
    quat: float = QUAT_SCALE,
    joint_rad: float = JOINT_SCALE_RAD,
    gripper_m: float = GRIPPER_SCALE_M,
) -> np.ndarray:
    """(LOWDIM_STATE_DIM,) fixed fleet-wide scales dividing the raw low-dim state.

    Lengths (object positions and vectors, end-effector position), quaternion components,
    joint angles and finger positions each get one divisor (defaults: the FeDepth
    descriptor's; the RND descriptor passes its own units).
    """
    obj = np.full(ep.OBJECT_STATE_DIM, float(length_m))
    obj[list(ep.OBJECT_QUAT_SLOTS)] = quat
    scale = np.concatenate(
        [
            obj,
            np.full(3, float(length_m)),
            np.full(4, float(quat)),
            np.full(7, float(joint_rad)),
            np.full(2, float(gripper_m)),
        ]
    )
    assert scale.shape == (LOWDIM_STATE_DIM,)
    return scale


class RandomFourierFeatures(nn.Module):
    """cos(W (x / scale) + b), W ~ N(0, 1/L^2), b ~ U[0, 2 pi): (n, 53) -> (n, width),
    in [-1, 1]."""

    inv_scale: torch.Tensor  # buffers (register_buffer below), declared for the type checker
    W: torch.Tensor
    b: torch.Tensor

    def __init__(
        self, scale: np.ndarray, width: int, lengthscale: float, gen: torch.Generator
    ) -> None:
        super().__init__()
        if width < 1 or not lengthscale > 0:
            raise ValueError(
                f"width must be >= 1 and lengthscale > 0, got {width!r}, {lengthscale!r}"
            )
        d = scale.shape[0]
        self.register_buffer("inv_scale", torch.from_numpy(1.0 / np.asarray(scale, np.float64)))
        self.register_buffer(
            "W", torch.randn((d, width), generator=gen, dtype=torch.float64) / lengthscale
        )
        self.register_buffer(
            "b", torch.rand((width,), generator=gen, dtype=torch.float64) * 2 * np.pi
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Features of (n, d) float64 states."""
        return torch.cos((x * self.inv_scale) @ self.W + self.b)


def frozen_image_encoder(seed: int = DESCRIPTOR_SEED) -> nn.Module:
    """Fixed random conv encoder (float64, eval, no grad): (n,3,H,W) -> (n,64,h,w) maps."""
    enc = nn.Sequential(
        nn.Conv2d(3, 16, 5, 2, 2),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, 2, 1),
        nn.ReLU(),
    )
    return _kaiming_(enc.double(), _gen(seed)).eval().requires_grad_(False)


def frozen_lowdim_encoder(seed: int = DESCRIPTOR_SEED, width: int = 64) -> nn.Module:
    """Fixed random Fourier features of the scaled low-dim state: (n, 53) -> (n, width)
    in [-1, 1]."""
    return RandomFourierFeatures(lowdim_state_scale(), width, RFF_LENGTHSCALE, _gen(seed)).eval()


def gem_pool(maps: torch.Tensor, p: float = 3.0, eps: float = 1e-6) -> torch.Tensor:
    """Generalised-mean pooling per channel: (n,C,h,w) -> (n,C), (mean x^p)^(1/p)."""
    if not p > 0:
        raise ValueError(f"GeM p must be > 0, got {p!r}")
    return maps.clamp_min(eps).pow(p).mean(dim=(-2, -1)).pow(1.0 / p)


@torch.no_grad()
def image_feature_power(
    height: int, width: int, p: float = 3.0, seed: int = DESCRIPTOR_SEED
) -> float:
    """Nominal per-channel power (mean square) of the image descriptor's GeM features.

    Measured on one fixed reference image (uniform noise from ``seed``) of the given size,
    so it is a fleet-wide constant of the encoder, not a statistic of any robot's data.
    """
    ref = torch.rand((1, 3, height, width), generator=_gen(seed + 1), dtype=torch.float64)
    feats = gem_pool(frozen_image_encoder(seed)(ref), p)
    return float(feats.pow(2).mean())


@torch.no_grad()
def descriptor_features(
    episodes: Sequence[Episode],
    n_frames: int | None = 64,
    seed: int = 0,
    p: float = 3.0,
    mode: str = "auto",
    policy_cfg: PolicyConfig | None = None,
) -> np.ndarray:
    """Per-frame descriptor vectors (n, C): GeM-pooled conv features or low-dim Fourier features."""
    episodes = list(episodes)
    mode = _detect_mode(episodes, policy_cfg) if mode == "auto" else mode
    x = _gather(episodes, _sample_frames(episodes, n_frames, seed), mode)
    if mode == "image":
        feats = gem_pool(frozen_image_encoder()(x), p)
    else:
        # Low-dim: the random-feature vector plays the role of the pooled channels.
        feats = frozen_lowdim_encoder()(x)
    return feats.numpy()


def variance_floor(mode: str, image_hw: tuple[int, int] | None = None, p: float = 3.0) -> float:
    """Per-channel variance floor: VARIANCE_FLOOR_FRACTION of the encoder's nominal feature
    power."""
    if mode == "lowdim":
        power = 0.5  # E[cos^2(u + b)] for a uniform random phase b
    elif mode == "image":
        if image_hw is None:
            raise ValueError("image variance floor needs the image size (height, width)")
        power = image_feature_power(int(image_hw[0]), int(image_hw[1]), p)
    else:
        raise ValueError(f"descriptor mode must be 'image' or 'lowdim', got {mode!r}")
    return max(VARIANCE_FLOOR_FRACTION[mode] * power, MIN_VARIANCE)


def gaussian_descriptor(
    episodes: Sequence[Episode],
    n_frames: int | None = 64,
    seed: int = 0,
    p: float = 3.0,
    mode: str = "auto",
    policy_cfg: PolicyConfig | None = None,
    state_dict: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """FeDepth descriptor: per-channel (mean, variance) of the frozen features over sampled frames.

    The encoder is a frozen fixed-seed network shared by the whole fleet, so descriptors of
    different robots are comparable. Variances are floored at `variance_floor` (a fixed
    fraction of the feature scale, the same on every robot). ``policy_cfg`` only chooses
    image vs low-dim inputs; ``state_dict`` is accepted for interface symmetry and not used
    (a robot's own trained trunk would make descriptors of different robots incomparable).
    """
    del state_dict
    episodes = list(episodes)
    mode = _detect_mode(episodes, policy_cfg) if mode == "auto" else mode
    feats = descriptor_features(episodes, n_frames, seed, p, mode, policy_cfg)
    hw = None
    if mode == "image":
        hw = episodes[0].observations[ep.AGENTVIEW_IMAGE].shape[1:3]
    mean = feats.mean(0)
    var = np.maximum(feats.var(0), variance_floor(mode, hw, p))
    return mean.astype(np.float64), var.astype(np.float64)


# ---------------------------------------------------------------------------------------
# Penultimate-layer embeddings


@torch.no_grad()
def penultimate_embeddings(
    state_dict: dict[str, np.ndarray],
    policy_cfg: Any,
    episodes: Any,
    max_windows: int | None = 1024,
    seed: int = 0,
    batch_size: int = 128,
) -> np.ndarray:
    """(n, embed_dim) action-token embeddings (input of the GMM head) of windows of episodes.

    Windows are all frames of the episodes, failed ones included (or ``max_windows``
    sampled ones, in frame order). The argument order ``(state_dict, episodes, policy_cfg)`` is also
    accepted.
    """
    from fed_ros.learning.dataset import DemoDataset
    from fed_ros.learning.modeling_policy import build_policy
    from fed_ros.learning.weights import load_state_dict_into

    if isinstance(episodes, PolicyConfig) and not isinstance(policy_cfg, PolicyConfig):
        policy_cfg, episodes = episodes, policy_cfg
    if not isinstance(policy_cfg, PolicyConfig):
        raise ValueError(f"policy_cfg must be a PolicyConfig, got {type(policy_cfg).__name__}")
    model = load_state_dict_into(build_policy(policy_cfg, seed=0), state_dict).eval()
    # Embeddings describe data, so failed demonstrations are embedded too (the dataset
    # would drop them for training).
    data = DemoDataset([dataclasses.replace(e, success=True) for e in episodes], policy_cfg)
    idx = np.arange(len(data))
    if max_windows is not None and len(idx) > max_windows:
        idx = np.sort(np.random.default_rng(seed).choice(len(idx), max_windows, replace=False))
    out = []
    for start in range(0, len(idx), batch_size):
        batch = data.torch_batch(idx[start : start + batch_size])
        out.append(model.compute(batch).embedding[:, -1].float())
    return torch.cat(out).numpy().astype(np.float32)

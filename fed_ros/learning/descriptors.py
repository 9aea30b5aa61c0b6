"""Client descriptors for clustering: FeDepth Gaussian, RND predictors, policy embeddings.

Everything that must be comparable across robots is derived from fleet-wide seeds (frozen
encoders, RND target) and from the data only, computed in float64 on the CPU, so identical
data give bit-identical descriptors on every robot.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fed_ros.core import episode as ep
from fed_ros.core.episode import Episode
from fed_ros.learning.configuration_policy import PolicyConfig

DESCRIPTOR_SEED = 7_001  # fleet-wide: the frozen descriptor encoder
RND_TARGET_SEED = 7_002  # fleet-wide: the RND target network
RND_IMAGE_SIZE = 32  # images are average-pooled to this side before RND
RND_OUT_DIM = 64
LOWDIM_STATE_KEYS = (ep.OBJECT_STATE, ep.EEF_POS, ep.EEF_QUAT, ep.JOINT_POS, ep.GRIPPER_QPOS)
LOWDIM_STATE_DIM = ep.OBJECT_STATE_DIM + 3 + 4 + 7 + 2
MIN_VARIANCE = 1e-8  # descriptors must have variances > 0 (reliability V5)


def _kaiming_(module: nn.Module, gen: torch.Generator) -> nn.Module:
    """Initialise conv/linear weights from ``gen`` only (independent of the global RNG)."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen, dtype=m.weight.dtype)
                               * (2.0 / fan_in) ** 0.5)
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


def _gather(episodes: Sequence[Episode], frames: list[tuple[int, int]], mode: str,
            image_key: str = ep.AGENTVIEW_IMAGE) -> torch.Tensor:
    """Inputs as float64: images (n,3,H,W) in [0,1] or low-dim states (n, LOWDIM_STATE_DIM)."""
    if mode == "image":
        for i, e in enumerate(episodes):
            if image_key not in e.observations:
                raise ValueError(f"episode {i} ({e.task!r}) lacks {image_key!r} for an image descriptor")
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
        rows.append(np.concatenate([np.asarray(obs[k][t], np.float64).reshape(-1)
                                    for k in LOWDIM_STATE_KEYS]))
    x = np.stack(rows)
    if x.shape[1] != LOWDIM_STATE_DIM:
        raise ValueError(f"low-dim state has {x.shape[1]} values, expected {LOWDIM_STATE_DIM}")
    return torch.from_numpy(x)


# ---------------------------------------------------------------------------------------
# FeDepth Gaussian descriptor


def frozen_image_encoder(seed: int = DESCRIPTOR_SEED) -> nn.Module:
    """Fixed random conv encoder (float64, eval, no grad): (n,3,H,W) -> (n,64,h,w) maps."""
    enc = nn.Sequential(nn.Conv2d(3, 16, 5, 2, 2), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                        nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU())
    return _kaiming_(enc.double(), _gen(seed)).eval().requires_grad_(False)


def frozen_lowdim_encoder(seed: int = DESCRIPTOR_SEED, width: int = 64) -> nn.Module:
    """Fixed random-feature map of the low-dim state: relu(W x + b), (n, 53) -> (n, width)."""
    enc = nn.Sequential(nn.Linear(LOWDIM_STATE_DIM, width), nn.ReLU())
    return _kaiming_(enc.double(), _gen(seed)).eval().requires_grad_(False)


def gem_pool(maps: torch.Tensor, p: float = 3.0, eps: float = 1e-6) -> torch.Tensor:
    """Generalised-mean pooling per channel: (n,C,h,w) -> (n,C), (mean x^p)^(1/p)."""
    if not p > 0:
        raise ValueError(f"GeM p must be > 0, got {p!r}")
    return maps.clamp_min(eps).pow(p).mean(dim=(-2, -1)).pow(1.0 / p)


@torch.no_grad()
def descriptor_features(episodes: Sequence[Episode], n_frames: int | None = 64, seed: int = 0,
                        p: float = 3.0, mode: str = "auto",
                        policy_cfg: PolicyConfig | None = None) -> np.ndarray:
    """Per-frame descriptor vectors (n, C): GeM-pooled frozen-encoder features."""
    episodes = list(episodes)
    mode = _detect_mode(episodes, policy_cfg) if mode == "auto" else mode
    x = _gather(episodes, _sample_frames(episodes, n_frames, seed), mode)
    if mode == "image":
        feats = gem_pool(frozen_image_encoder()(x), p)
    else:
        # Low-dim: the random-feature vector plays the role of the pooled channels.
        feats = frozen_lowdim_encoder()(x)
    return feats.numpy()


def gaussian_descriptor(episodes: Sequence[Episode], n_frames: int | None = 64, seed: int = 0,
                        p: float = 3.0, mode: str = "auto",
                        policy_cfg: PolicyConfig | None = None,
                        state_dict: dict[str, np.ndarray] | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """FeDepth descriptor: per-channel (mean, variance) of GeM features over sampled frames.

    The encoder is a frozen fixed-seed network shared by the whole fleet, so descriptors of
    different robots are comparable. ``policy_cfg`` only chooses image vs low-dim inputs;
    ``state_dict`` is accepted for interface symmetry and not used (a robot's own trained
    trunk would make descriptors of different robots incomparable).
    """
    del state_dict
    feats = descriptor_features(episodes, n_frames, seed, p, mode, policy_cfg)
    mean = feats.mean(0)
    var = np.maximum(feats.var(0), MIN_VARIANCE)
    return mean.astype(np.float64), var.astype(np.float64)


# ---------------------------------------------------------------------------------------
# RND


class _RNDImageNet(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, width, 4, 2, 1), nn.LeakyReLU(),
                                 nn.Conv2d(width, 2 * width, 4, 2, 1), nn.LeakyReLU(),
                                 nn.Conv2d(2 * width, 2 * width, 3, 2, 1), nn.LeakyReLU(),
                                 nn.Flatten(), nn.Linear(2 * width * 16, RND_OUT_DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _rnd_net(mode: str, role: str) -> nn.Module:
    """Target (larger, fixed) or predictor (small, trained) network for a mode."""
    if mode == "image":
        return _RNDImageNet(16 if role == "target" else 8)
    if mode == "lowdim":
        hidden = 128 if role == "target" else 64
        return nn.Sequential(nn.Linear(LOWDIM_STATE_DIM, hidden), nn.LeakyReLU(),
                             nn.Linear(hidden, hidden), nn.LeakyReLU(),
                             nn.Linear(hidden, RND_OUT_DIM))
    raise ValueError(f"RND mode must be 'image' or 'lowdim', got {mode!r}")


def _rnd_inputs(x: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "image" and x.shape[-1] != RND_IMAGE_SIZE:
        x = F.adaptive_avg_pool2d(x, RND_IMAGE_SIZE)
    return x.float()


class RNDModels:
    """The fleet-wide fixed random target (seed shared by all robots) and predictor factory."""

    def __init__(self, mode: str, target_seed: int = RND_TARGET_SEED) -> None:
        self.mode = mode
        self.target = _kaiming_(_rnd_net(mode, "target"), _gen(target_seed)).eval()
        self.target.requires_grad_(False)

    def new_predictor(self, seed: int) -> nn.Module:
        """A fresh trainable predictor initialised from ``seed``."""
        return _kaiming_(_rnd_net(self.mode, "predictor"), _gen(seed))

    @torch.no_grad()
    def residuals(self, predictor: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Per-sample squared residual ||f_hat(x) - f(x)||^2: (n,)."""
        predictor.eval()
        out = []
        for start in range(0, len(x), 512):
            xb = x[start:start + 512]
            out.append((predictor(xb) - self.target(xb)).pow(2).sum(-1))
        return torch.cat(out)


def train_rnd_predictor(episodes: Sequence[Episode], seed: int = 0, mode: str = "auto",
                        steps: int = 300, lr: float = 1e-3, batch_size: int = 128,
                        max_frames: int | None = 4096, target_seed: int = RND_TARGET_SEED) -> bytes:
    """Train a predictor to regress the fixed target on local frames (MSE); safetensors bytes."""
    episodes = list(episodes)
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    mode = _detect_mode(episodes, None) if mode == "auto" else mode
    models = RNDModels(mode, target_seed)
    x = _rnd_inputs(_gather(episodes, _sample_frames(episodes, max_frames, seed), mode), mode)
    with torch.no_grad():
        y = models.target(x)
    predictor = models.new_predictor(seed + 1)
    opt = torch.optim.Adam(predictor.parameters(), lr=lr)
    gen = _gen(seed + 2)
    predictor.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (min(batch_size, len(x)),), generator=gen)
        loss = (predictor(x[idx]) - y[idx]).pow(2).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    meta = {"mode": mode, "target_seed": str(target_seed), "format": "fed_ros.rnd.v1"}
    tensors = {k: v.detach().contiguous() for k, v in predictor.state_dict().items()}
    return st_save(tensors, metadata=meta)


def load_rnd_predictor(blob: bytes) -> tuple[nn.Module, RNDModels]:
    """Rebuild (predictor, models) from :func:`train_rnd_predictor` bytes; no code runs."""
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < 8:
        raise ValueError("RND predictor payload is not safetensors bytes")
    n = int.from_bytes(bytes(blob[:8]), "little")
    if n <= 0 or 8 + n > len(blob):
        raise ValueError("RND predictor payload has a corrupt header")
    header = json.loads(bytes(blob[8:8 + n]).decode())
    meta = header.get("__metadata__") or {}
    if meta.get("format") != "fed_ros.rnd.v1":
        raise ValueError(f"RND predictor payload has unknown format {meta.get('format')!r}")
    models = RNDModels(meta["mode"], int(meta["target_seed"]))
    predictor = models.new_predictor(0)
    tensors = st_load(bytes(blob))
    own = predictor.state_dict()
    if set(tensors) != set(own) or any(tensors[k].shape != own[k].shape for k in own):
        raise ValueError("RND predictor payload does not match the predictor architecture")
    predictor.load_state_dict(tensors)
    return predictor.eval(), models


def rnd_residuals(predictor_bytes: bytes, episodes: Sequence[Episode], max_frames: int | None = 2048,
                  seed: int = 0) -> np.ndarray:
    """Per-frame squared residuals of a predictor on (a sample of) local frames."""
    predictor, models = load_rnd_predictor(predictor_bytes)
    episodes = list(episodes)
    x = _rnd_inputs(_gather(episodes, _sample_frames(episodes, max_frames, seed), models.mode),
                    models.mode)
    return models.residuals(predictor, x).double().numpy()


def rnd_novelty(predictor_bytes: bytes, episodes: Sequence[Episode], max_frames: int | None = 2048,
                seed: int = 0) -> float:
    """s_ij = E_x ||f_hat_j(x) - f(x)||^2 of predictor j on these (robot i's) episodes."""
    return float(rnd_residuals(predictor_bytes, episodes, max_frames, seed).mean())


def rnd_residual_std(predictor_bytes: bytes, episodes: Sequence[Episode],
                     max_frames: int | None = 2048, seed: int = 0) -> float:
    """sigma_i: std of the per-frame residuals of a predictor on its own robot's frames."""
    return float(rnd_residuals(predictor_bytes, episodes, max_frames, seed).std())


# ---------------------------------------------------------------------------------------
# Penultimate-layer embeddings


@torch.no_grad()
def penultimate_embeddings(state_dict: dict[str, np.ndarray], policy_cfg: Any, episodes: Any,
                           max_windows: int | None = 1024, seed: int = 0,
                           batch_size: int = 128) -> np.ndarray:
    """(n, embed_dim) action-token embeddings (input of the GMM head) of windows of episodes.

    Windows are all frames of the episodes, failed ones included (or ``max_windows``
    sampled ones, in frame order). The argument order ``(state_dict, episodes, policy_cfg)`` is also accepted.
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
        batch = data.torch_batch(idx[start:start + batch_size])
        out.append(model.compute(batch).embedding[:, -1].float())
    return torch.cat(out).numpy().astype(np.float32)

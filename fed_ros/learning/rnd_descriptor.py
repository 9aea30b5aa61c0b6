"""RND descriptors: a fleet-wide fixed random target, per-robot predictors, novelty scores.

Robot j trains a small predictor to regress the fixed random target network (same seed on
every robot) on its local frames; peers evaluate it on their own frames (novelty s_ij);
the residual spread sigma_i of a robot's own predictor sets the compatibility margin
(`fed_ros.core.rnd`). Predictors travel as safetensors bytes (no code is run on load).
"""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fed_ros.core.episode import Episode
from fed_ros.learning.descriptors import LOWDIM_STATE_DIM, _detect_mode, _gather, _gen, _kaiming_, _sample_frames

RND_TARGET_SEED = 7_002  # fleet-wide: the RND target network
RND_IMAGE_SIZE = 32  # images are average-pooled to this side before RND
RND_OUT_DIM = 64




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

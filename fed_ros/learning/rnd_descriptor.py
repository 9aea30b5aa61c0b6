"""RND descriptors: a fleet-wide fixed random target, per-robot predictors, novelty scores.

Robot j trains a small predictor to regress the fixed random target network (same seed on
every robot) on its local frames; peers evaluate it on their own frames (novelty s_ij).
A robot's own self-novelty s_ii and residual spread sigma_i (the compatibility margin of
`fed_ros.core.clustering.rnd`) are measured on frames its predictor has NOT seen: episode-level
K-fold cross-validation (:func:`fit_rnd`). Measured on its training frames instead, an
overfitted predictor makes every peer, even one in the same work cell, look novel.
Predictors travel as safetensors bytes (no code is run on load).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from fed_ros.core.data import episode as ep
from fed_ros.core.data.episode import Episode
from fed_ros.learning.descriptors import (
    LOWDIM_STATE_DIM,
    _detect_mode,
    _gather,
    _gen,
    _kaiming_,
    _sample_frames,
    lowdim_state_scale,
)

RND_TARGET_SEED = 7_002  # fleet-wide: the RND target network
RND_IMAGE_SIZE = 32  # images are average-pooled to this side before RND
RND_OUT_DIM = 64
RND_FORMAT = (
    "fed_ros.rnd.v2"  # v2: low-dim inputs in fleet-wide fixed units (v1 predictors are rejected)
)
RND_CV_FOLDS = 3  # folds of the episode-level cross-validation of s_ii and sigma_i
# Low-dim RND inputs are expressed in fleet-wide FIXED units before the target sees them:
# lengths (positions, eef->object vectors, finger openings; metres in the observation) in
# units of RND_LENGTH_M, angles (rad) and quaternion components unchanged. Raw, a 5 cm
# object displacement moves the input as little as a 0.05 rad joint wobble, so the random
# target barely separates work cells while per-episode nuisances (cube yaw, arm posture)
# dominate the novelty. Burda et al. standardise RND inputs with running statistics, but
# per-robot statistics would give every robot a different input map and make predictors
# incomparable across robots; fixed constants of the fleet-wide observation layout give
# every robot the identical map. 0.1 m is the tabletop manipulation scale (objects and
# their displacements are centimetres to decimetres); the benchmark measured the same
# federations with 0.05 m and 0.2 m (docs/benchmark.md), so the value is not critical.
RND_LENGTH_M = 0.1
# object_state layout: fed_ros.core.data.episode (re-exported for the RND unit tests).
OBJECT_STRIDE = ep.OBJECT_STRIDE
OBJECT_QUAT_SLOTS = range(ep.OBJECT_FIELDS["quat"].start, ep.OBJECT_FIELDS["quat"].stop)


def lowdim_input_scale() -> torch.Tensor:
    """(LOWDIM_STATE_DIM,) fleet-wide divisors of the low-dim RND input (see RND_LENGTH_M):
    lengths and finger openings in RND_LENGTH_M, quaternion components and angles as is."""
    return torch.from_numpy(
        lowdim_state_scale(length_m=RND_LENGTH_M, quat=1.0, joint_rad=1.0, gripper_m=RND_LENGTH_M)
    )


class _RNDImageNet(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 4, 2, 1),
            nn.LeakyReLU(),
            nn.Conv2d(width, 2 * width, 4, 2, 1),
            nn.LeakyReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, 2, 1),
            nn.LeakyReLU(),
            nn.Flatten(),
            nn.Linear(2 * width * 16, RND_OUT_DIM),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _rnd_net(mode: str, role: str) -> nn.Module:
    """Target (larger, fixed) or predictor (small, trained) network for a mode."""
    if mode == "image":
        return _RNDImageNet(16 if role == "target" else 8)
    if mode == "lowdim":
        hidden = 128 if role == "target" else 64
        return nn.Sequential(
            nn.Linear(LOWDIM_STATE_DIM, hidden),
            nn.LeakyReLU(),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(),
            nn.Linear(hidden, RND_OUT_DIM),
        )
    raise ValueError(f"RND mode must be 'image' or 'lowdim', got {mode!r}")


def _rnd_inputs(x: torch.Tensor, mode: str) -> torch.Tensor:
    """Gathered frames -> RND inputs: images pooled (already in [0, 1]); states in fixed units."""
    if mode == "image":
        if x.shape[-1] != RND_IMAGE_SIZE:
            x = F.adaptive_avg_pool2d(x, RND_IMAGE_SIZE)
        return x.float()
    return (x / lowdim_input_scale()).float()


def _inputs(
    episodes: Sequence[Episode], mode: str, max_frames: int | None, seed: int
) -> torch.Tensor:
    return _rnd_inputs(_gather(episodes, _sample_frames(episodes, max_frames, seed), mode), mode)


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
            xb = x[start : start + 512]
            out.append((predictor(xb) - self.target(xb)).pow(2).sum(-1))
        return torch.cat(out)


def _check_training_args(steps: int, batch_size: int, lr: float) -> None:
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be finite and > 0, got {lr!r}")


def _fit_predictor(
    models: RNDModels, x: torch.Tensor, seed: int, steps: int, lr: float, batch_size: int
) -> nn.Module:
    """Regress the fixed target on inputs ``x`` (MSE); deterministic given ``seed``."""
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
    return predictor.eval()


def _to_bytes(predictor: nn.Module, mode: str, target_seed: int) -> bytes:
    meta = {"mode": mode, "target_seed": str(target_seed), "format": RND_FORMAT}
    tensors = {k: v.detach().contiguous() for k, v in predictor.state_dict().items()}
    return st_save(tensors, metadata=meta)


def train_rnd_predictor(
    episodes: Sequence[Episode],
    seed: int = 0,
    mode: str = "auto",
    steps: int = 300,
    lr: float = 1e-3,
    batch_size: int = 128,
    max_frames: int | None = 4096,
    target_seed: int = RND_TARGET_SEED,
) -> bytes:
    """Train a predictor to regress the fixed target on local frames (MSE); safetensors bytes."""
    episodes = list(episodes)
    _check_training_args(steps, batch_size, lr)
    mode = _detect_mode(episodes, None) if mode == "auto" else mode
    models = RNDModels(mode, target_seed)
    predictor = _fit_predictor(
        models, _inputs(episodes, mode, max_frames, seed), seed, steps, lr, batch_size
    )
    return _to_bytes(predictor, mode, target_seed)


@dataclass(frozen=True)
class RNDFit:
    """What a robot publishes about itself: its predictor and its held-out self-novelty."""

    predictor: bytes  # trained on ALL local episodes; peers evaluate it on their frames (s_ji)
    self_novelty: float  # s_ii: mean held-out squared residual (episode-level cross-validation)
    residual_std: float  # sigma_i: std of the same held-out per-frame residuals
    folds: int  # cross-validation folds actually used


def _time_blocks(episode: Episode, k: int) -> list[Episode]:
    """Cut one episode into ``k`` contiguous time blocks (pseudo-episodes for the split)."""
    cuts = np.linspace(0, len(episode), k + 1).round().astype(int)
    return [
        dataclasses.replace(
            episode,
            observations={key: v[a:b] for key, v in episode.observations.items()},
            actions=episode.actions[a:b],
        )
        for a, b in zip(cuts[:-1], cuts[1:])
    ]


def episode_folds(n_episodes: int, seed: int, folds: int = RND_CV_FOLDS) -> list[list[int]]:
    """Deterministic episode-level K-fold split: K = min(folds, n) folds of episode indices.

    The episodes are permuted with ``seed`` and dealt round-robin, so every episode is held
    out exactly once and every fold holds out at least one episode.
    """
    if n_episodes < 2:
        raise ValueError(f"a held-out split needs >= 2 episodes, got {n_episodes}")
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    k = min(folds, n_episodes)
    order = np.random.default_rng(seed).permutation(n_episodes)
    return [sorted(int(i) for i in order[f::k]) for f in range(k)]


def fit_rnd(
    episodes: Sequence[Episode],
    seed: int = 0,
    mode: str = "auto",
    folds: int = RND_CV_FOLDS,
    steps: int = 300,
    lr: float = 1e-3,
    batch_size: int = 128,
    max_frames: int | None = 4096,
    target_seed: int = RND_TARGET_SEED,
) -> RNDFit:
    """A robot's RND descriptor in one call: predictor bytes, held-out s_ii and sigma_i.

    Rule: the shipped predictor is trained on all local episodes. s_ii and sigma_i come from
    episode-level K-fold cross-validation (K = min(``folds``, episodes), split by ``seed``,
    :func:`episode_folds`): for each fold a predictor (same seed and settings) is trained on
    the other episodes and its per-frame residuals on the held-out episodes are pooled; s_ii
    is their mean and sigma_i their std. So s_ii, like a peer's s_ij, is the novelty of a
    predictor on episodes it has not seen (slightly pessimistic: the fold predictors saw
    fewer episodes). A robot with a single episode splits it into K contiguous time blocks.
    Cost: K + 1 predictor trainings.
    """
    episodes = list(episodes)
    if not episodes:
        raise ValueError("fit_rnd needs at least one episode")
    _check_training_args(steps, batch_size, lr)
    mode = _detect_mode(episodes, None) if mode == "auto" else mode
    units = episodes
    if len(units) == 1:
        if len(units[0]) < 2:
            raise ValueError(
                f"a single episode of {len(units[0])} frame(s) cannot be split for held-out novelty"
            )
        units = _time_blocks(units[0], min(max(2, folds), len(units[0])))
    models = RNDModels(mode, target_seed)
    residuals = []
    for held in episode_folds(len(units), seed, folds):
        held_set = set(held)
        train = [u for i, u in enumerate(units) if i not in held_set]
        predictor = _fit_predictor(
            models, _inputs(train, mode, max_frames, seed), seed, steps, lr, batch_size
        )
        residuals.append(
            models.residuals(predictor, _inputs([units[i] for i in held], mode, max_frames, seed))
        )
    res = torch.cat(residuals).double().numpy()
    full = _fit_predictor(
        models, _inputs(episodes, mode, max_frames, seed), seed, steps, lr, batch_size
    )
    return RNDFit(
        predictor=_to_bytes(full, mode, target_seed),
        self_novelty=float(res.mean()),
        residual_std=float(res.std()),
        folds=len(residuals),
    )


def load_rnd_predictor(blob: bytes) -> tuple[nn.Module, RNDModels]:
    """Rebuild (predictor, models) from :func:`train_rnd_predictor` bytes; no code runs."""
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < 8:
        raise ValueError("RND predictor payload is not safetensors bytes")
    n = int.from_bytes(bytes(blob[:8]), "little")
    if n <= 0 or 8 + n > len(blob):
        raise ValueError("RND predictor payload has a corrupt header")
    header = json.loads(bytes(blob[8 : 8 + n]).decode())
    meta = header.get("__metadata__") or {}
    if meta.get("format") != RND_FORMAT:
        raise ValueError(f"RND predictor payload has unknown format {meta.get('format')!r}")
    models = RNDModels(meta["mode"], int(meta["target_seed"]))
    predictor = models.new_predictor(0)
    tensors = st_load(bytes(blob))
    own = predictor.state_dict()
    if set(tensors) != set(own) or any(tensors[k].shape != own[k].shape for k in own):
        raise ValueError("RND predictor payload does not match the predictor architecture")
    predictor.load_state_dict(tensors)
    return predictor.eval(), models


def rnd_residuals(
    predictor_bytes: bytes,
    episodes: Sequence[Episode],
    max_frames: int | None = 2048,
    seed: int = 0,
) -> np.ndarray:
    """Per-frame squared residuals of a predictor on (a sample of) local frames."""
    predictor, models = load_rnd_predictor(predictor_bytes)
    return (
        models.residuals(predictor, _inputs(list(episodes), models.mode, max_frames, seed))
        .double()
        .numpy()
    )


def rnd_novelty(
    predictor_bytes: bytes,
    episodes: Sequence[Episode],
    max_frames: int | None = 2048,
    seed: int = 0,
) -> float:
    """s_ij = E_x ||f_hat_j(x) - f(x)||^2 of predictor j on these (robot i's) episodes."""
    return float(rnd_residuals(predictor_bytes, episodes, max_frames, seed).mean())


def rnd_residual_std(
    predictor_bytes: bytes,
    episodes: Sequence[Episode],
    max_frames: int | None = 2048,
    seed: int = 0,
) -> float:
    """Std of a predictor's per-frame residuals on these episodes.

    Not sigma_i of the compatibility rule when these are the predictor's own training
    frames (use :func:`fit_rnd`, which measures it on held-out episodes).
    """
    return float(rnd_residuals(predictor_bytes, episodes, max_frames, seed).std())

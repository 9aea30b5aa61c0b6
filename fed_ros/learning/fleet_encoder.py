"""The fleet's shared visual encoder: trained on every recorded frame, FedAvg'd fleet-wide.

Seeing is shared even where acting conflicts: a mirrored-mount arm needs the opposite command
for the same picture, yet the same features serve both. So the camera trunk
(`backbones.fleet.FleetConvNet`) is trained by every robot on every frame it has recorded
(demonstrations, rollouts, interventions: success does not matter), with an objective that
needs nothing a real arm lacks (`FleetEncoderConfig.objective`), and averaged across all
robots, never per cluster. A policy then reads it as a frozen backbone
(``vision_backbone="fleet"``, ``backbone_weights`` = the file `save_backbone` wrote): its
features are cached per frame, so a policy step costs about a low-dim step.

One robot's part is `train_encoder` (the `RobotClient.fit_encoder` call); the server's is
`aggregate_encoders`, plain FedAvg weighted by frame count.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

from fed_ros.core.data.episode import EEF_POS, EEF_QUAT, GRIPPER_QPOS, JOINT_POS, Episode
from fed_ros.core.strategies.aggregate import fedavg
from fed_ros.learning.backbones.fleet import FleetConvNet
from fed_ros.learning.backbones.trunk import IMAGENET_MEAN, IMAGENET_STD, backbone_input
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
from fed_ros.learning.policy_modules import SpatialSoftmax, mlp
from fed_ros.learning.trainer import LocalResult

StateDict = dict[str, np.ndarray]
BACKBONE_PREFIX = "backbone."

# Proprioceptive targets and the fixed scale each is divided by. The scales are fleet-wide
# constants, not per-robot statistics, so every robot's head regresses the same units and
# FedAvg of the heads is meaningful; each is about the key's range over a task.
PROPRIO_TARGETS: tuple[tuple[str, int, float], ...] = (
    (JOINT_POS, 7, 1.0),  # rad
    (GRIPPER_QPOS, 2, 0.04),  # m, finger travel
    (EEF_POS, 3, 0.2),  # m
    (EEF_QUAT, 4, 1.0),  # unit quaternion
)
PROPRIO_DIM = sum(d for _, d, _ in PROPRIO_TARGETS)
_HIDDEN = 128
_PROJECTION_DIM = 64
_DECODER_WIDTH = 32


class MaskedDecoder(nn.Module):
    """The masked objective's head: the trunk's feature map (N, 64, h, w) up to a
    half-resolution image (N, 3, size, size) in the trunk's normalised colour space."""

    def __init__(self, width: int, size: int) -> None:
        super().__init__()
        self.size = size
        self.conv1 = nn.Conv2d(width, _DECODER_WIDTH, 3, 1, 1)
        self.conv2 = nn.Conv2d(_DECODER_WIDTH, _DECODER_WIDTH // 2, 3, 1, 1)
        self.out = nn.Conv2d(_DECODER_WIDTH // 2, 3, 3, 1, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(h))
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = F.relu(self.conv2(h))
        h = F.interpolate(h, size=(self.size, self.size), mode="nearest")
        return self.out(h)


class FleetEncoder(nn.Module):
    """The shared trunk (``backbone.*``, what policies read) plus the objective's head.

    Proprio: one regression head per camera (a wrist view and a scene view see the arm
    differently). Temporal: one projection head per camera into the InfoNCE space. Masked:
    one decoder per camera. Everything here is averaged fleet-wide; only ``backbone.*`` is
    written for policies.
    """

    def __init__(self, cfg: FleetEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.backbone = FleetConvNet()
        width = FleetConvNet.out_channels
        heads: dict[str, nn.Module]
        if cfg.objective == "masked":
            heads = {cam: MaskedDecoder(width, cfg.image_size // 2) for cam in cfg.cameras}
        else:
            self.keypoints = SpatialSoftmax(width, cfg.num_keypoints)
            out = PROPRIO_DIM if cfg.objective == "proprio" else _PROJECTION_DIM
            heads = {cam: mlp(2 * cfg.num_keypoints + width, _HIDDEN, out) for cam in cfg.cameras}
        self.heads = nn.ModuleDict(heads)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN)[:, None, None], False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD)[:, None, None], False)

    def normalised(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 frames (N, H, W, 3) as the trunk sees them: (N, 3, S, S), resized and
        ImageNet-normalised (the frozen trunk's input exactly)."""
        x = frames.permute(0, 3, 1, 2).float() / 255.0
        return backbone_input(x, self.cfg.image_size, self.mean, self.std)

    def embed(self, frames: torch.Tensor, camera: str) -> torch.Tensor:
        """Head outputs (N, out) of uint8 frames (N, H, W, 3) from ``camera``."""
        h = self.backbone(self.normalised(frames))
        pooled = torch.cat([self.keypoints(h), h.mean(dim=(2, 3))], dim=-1)
        return self.heads[camera](pooled)

    def reconstruct(self, x: torch.Tensor, camera: str) -> torch.Tensor:
        """The decoder's half-resolution image of normalised (masked) input ``x``."""
        return self.heads[camera](self.backbone(x))


def masked_loss(
    model: FleetEncoder, frames: torch.Tensor, hidden: torch.Tensor, camera: str
) -> torch.Tensor:
    """MSE of the reconstruction on the hidden patches only (MAE's loss).

    ``hidden`` (N, g, g) bool marks the patches set to 0, the mean colour after
    normalisation; the target is the unmasked frame at the decoder's half resolution."""
    x = model.normalised(frames)
    side = x.shape[-1]
    pixels = hidden.float()[:, None].repeat_interleave(model.cfg.mask_patch, 2)
    pixels = pixels.repeat_interleave(model.cfg.mask_patch, 3)[..., :side, :side]
    recon = model.reconstruct(x * (1.0 - pixels), camera)
    size = recon.shape[-1]
    target = F.interpolate(x, size=(size, size), mode="area")
    weight = F.interpolate(pixels, size=(size, size), mode="area")
    err = ((recon - target) ** 2 * weight).sum()
    return err / (3.0 * weight.sum()).clamp_min(1.0)


def proprio_targets(episode: Episode) -> np.ndarray:
    """(T, PROPRIO_DIM) scaled proprioception of an episode; ValueError naming a missing key."""
    cols = []
    for key, dim, scale in PROPRIO_TARGETS:
        if key not in episode.observations:
            raise ValueError(
                f"episode {episode.task!r} of robot {episode.robot_id!r} lacks {key!r}, "
                "which the proprio objective predicts"
            )
        value = np.asarray(episode.observations[key], np.float32).reshape(len(episode), -1)
        if value.shape[1] != dim:
            raise ValueError(f"{key!r} has {value.shape[1]} values per step, expected {dim}")
        cols.append(value / scale)
    return np.concatenate(cols, axis=1)


class FrameSampler:
    """Random frames (or frame pairs) of one robot's episodes, any camera in ``cfg.cameras``."""

    def __init__(self, episodes: Sequence[Episode], cfg: FleetEncoderConfig, seed: int) -> None:
        self.cfg = cfg
        self.episodes = [e for e in episodes if all(c in e.observations for c in cfg.cameras)]
        if not self.episodes:
            raise ValueError(f"no episode holds every camera of {cfg.cameras}")
        self.targets = (
            [proprio_targets(e) for e in self.episodes] if cfg.objective == "proprio" else None
        )
        self.lengths = np.array([len(e) for e in self.episodes])
        self.rng = np.random.default_rng(seed)

    @property
    def num_frames(self) -> int:
        """Time steps held (each with one frame per camera): the FedAvg weight."""
        return int(self.lengths.sum())

    def _steps(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        # Episodes in proportion to their length: every frame equally likely.
        ep = self.rng.choice(len(self.episodes), n, p=self.lengths / self.lengths.sum())
        return ep, (self.rng.random(n) * self.lengths[ep]).astype(int)

    def _frames(self, camera: str, ep: np.ndarray, t: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(
            np.stack([self.episodes[e].observations[camera][s] for e, s in zip(ep, t)])
        )

    def proprio_batch(self, camera: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames (n, H, W, 3) uint8 and their scaled proprioception (n, PROPRIO_DIM)."""
        ep, t = self._steps(n)
        targets = np.stack([self.targets[e][s] for e, s in zip(ep, t)])
        return self._frames(camera, ep, t), torch.from_numpy(targets)

    def pair_batch(self, camera: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Anchor frames and positives 1..``temporal_offset`` steps later, clipped to the
        episode (a one-step episode pairs a frame with itself)."""
        ep, t = self._steps(n)
        offset = self.rng.integers(1, self.cfg.temporal_offset + 1, n)
        later = np.minimum(t + offset, self.lengths[ep] - 1)
        return self._frames(camera, ep, t), self._frames(camera, ep, later)

    def masked_batch(self, camera: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Frames (n, H, W, 3) uint8 and which patches to hide, (n, g, g) bool with
        exactly round(``mask_ratio`` x g^2) hidden per frame (MAE samples without
        replacement), g = ceil(``image_size`` / ``mask_patch``)."""
        ep, t = self._steps(n)
        g = -(-self.cfg.image_size // self.cfg.mask_patch)
        k = min(g * g - 1, max(1, round(self.cfg.mask_ratio * g * g)))
        order = self.rng.random((n, g * g)).argsort(axis=1)
        hidden = np.zeros((n, g * g), bool)
        np.put_along_axis(hidden, order[:, :k], True, axis=1)
        return self._frames(camera, ep, t), torch.from_numpy(hidden.reshape(n, g, g))


def objective_loss(model: FleetEncoder, sampler: FrameSampler, camera: str, n: int) -> torch.Tensor:
    """The configured objective on one batch of ``camera``'s frames."""
    if model.cfg.objective == "proprio":
        frames, targets = sampler.proprio_batch(camera, n)
        return F.mse_loss(model.embed(frames, camera), targets)
    if model.cfg.objective == "masked":
        return masked_loss(model, *sampler.masked_batch(camera, n), camera)
    anchors, positives = sampler.pair_batch(camera, n)
    za = F.normalize(model.embed(anchors, camera), dim=-1)
    zp = F.normalize(model.embed(positives, camera), dim=-1)
    logits = za @ zp.T / model.cfg.temperature  # N,N: the diagonal holds the true pairs
    labels = torch.arange(len(za))
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def build_encoder(cfg: FleetEncoderConfig, state: StateDict | None = None) -> FleetEncoder:
    """A FleetEncoder seeded by ``cfg.seed``, loaded from ``state`` (strict) when given."""
    torch.manual_seed(cfg.seed)
    model = FleetEncoder(cfg)
    if state is not None:
        own = model.state_dict()
        wrong = sorted(set(state) ^ set(own)) or [
            k for k in own if tuple(np.shape(state[k])) != tuple(own[k].shape)
        ]
        if wrong:
            raise ValueError(
                f"encoder state does not fit objective {cfg.objective!r} and cameras "
                f"{cfg.cameras}: tensor {wrong[0]!r} is missing, unexpected or misshapen"
            )
        model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    return model


def encoder_state(model: nn.Module) -> StateDict:
    """Float32 numpy copy of a module's state dict (what travels and is averaged)."""
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}


def initial_encoder_state(cfg: FleetEncoderConfig) -> StateDict:
    """The fleet's first encoder (the server's, before any robot trained it)."""
    return encoder_state(build_encoder(cfg))


def train_encoder(
    state: StateDict, episodes: Sequence[Episode], cfg: FleetEncoderConfig, seed: int
) -> LocalResult:
    """One robot's encoder round: ``cfg.local_steps`` Adam steps on its frames, every camera
    in each step; (params, frames held, metrics ``loss_first``/``loss_last``/``cpu_s``)."""
    t0 = time.process_time()
    model = build_encoder(cfg, state).train()
    sampler = FrameSampler(episodes, cfg, seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = []
    for _ in range(cfg.local_steps):
        loss = sum(objective_loss(model, sampler, c, cfg.batch_size) for c in cfg.cameras)
        loss = loss / len(cfg.cameras)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    # First and last tenth of the steps: one batch is noisy.
    k = max(1, len(losses) // 10)
    metrics = {
        "loss_first": float(np.mean(losses[:k])),
        "loss_last": float(np.mean(losses[-k:])),
        "steps": float(len(losses)),
        "cpu_s": time.process_time() - t0,
    }
    return LocalResult(encoder_state(model), sampler.num_frames, metrics)


@torch.no_grad()
def evaluate_encoder(
    state: StateDict,
    episodes: Sequence[Episode],
    cfg: FleetEncoderConfig,
    batches: int = 4,
    seed: int = 0,
) -> float:
    """Mean objective loss of ``state`` on ``batches`` seeded batches per camera of episodes."""
    model = build_encoder(cfg, state).eval()
    sampler = FrameSampler(episodes, cfg, seed)
    losses = [
        float(objective_loss(model, sampler, c, cfg.batch_size))
        for _ in range(batches)
        for c in cfg.cameras
    ]
    return float(np.mean(losses))


def aggregate_encoders(results: Sequence[LocalResult]) -> StateDict:
    """Plain FedAvg over every robot's encoder, weighted by the frames each trained on."""
    return fedavg([r.params for r in results], [r.num_samples for r in results])


def save_backbone(state: StateDict, path: str | Path) -> Path:
    """Write the trunk (``backbone.*``, prefix dropped) as the ``.safetensors`` file a policy
    with ``vision_backbone="fleet"`` reads; atomic, so a policy never reads half a file."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"fleet encoder file must end in .safetensors, got {str(path)!r}")
    trunk = {
        k[len(BACKBONE_PREFIX) :]: torch.from_numpy(np.ascontiguousarray(v))
        for k, v in state.items()
        if k.startswith(BACKBONE_PREFIX)
    }
    if not trunk:
        raise ValueError("encoder state holds no backbone.* tensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    save_file(trunk, tmp)
    os.replace(tmp, path)
    return path

"""Building blocks of the GMM policy (:mod:`fed_ros.learning.modeling_policy`).

Per-modality encoders (:func:`mlp` for low-dim inputs and the instruction,
:class:`ImageEncoder`: stem conv -> :class:`FiLMResBlock` stages conditioned on the text ->
:class:`SpatialSoftmax` keypoints -> linear; :class:`PretrainedImageEncoder` on a published
backbone; :func:`image_encoder` picks one from the config), the block-causal
:class:`TemporalTransformer` over the window, and the mixture-of-Gaussians :class:`GMMHead`.
No normalisation state and no batch statistics (GroupNorm; a pretrained ResNet keeps its
published statistics fixed), so every parameter federates as it is.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fed_ros.learning.backbones.specs import SCRATCH
from fed_ros.learning.backbones.trunk import FrozenTrunk, PretrainedTrunk, frozen_trunk
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.losses import GMMParams


def mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
    # No dropout in the encoders: their features are what L_sub compares, and a dropout
    # mask would make student features differ from the (eval-mode) teacher's by noise alone.
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim))


def _groups(channels: int) -> int:
    for g in (8, 4, 2):
        if channels % g == 0:
            return g
    return 1


class FiLMResBlock(nn.Module):
    """Residual conv block whose output is modulated by (1 + gamma, beta) from the text."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, cond_dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(_groups(out_ch), out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(_groups(out_ch), out_ch)
        self.skip = (
            nn.Identity()
            if in_ch == out_ch and stride == 1
            else nn.Conv2d(in_ch, out_ch, 1, stride, bias=False)
        )
        self.film = nn.Linear(cond_dim, 2 * out_ch)
        # GroupNorm instead of BatchNorm: no running statistics to federate, deterministic.

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        gamma, beta = self.film(cond).chunk(2, dim=-1)
        h = h * (1.0 + gamma[:, :, None, None]) + beta[:, :, None, None]
        return F.relu(h + self.skip(x))


class SpatialSoftmax(nn.Module):
    """Keypoints: expected (x, y) in [-1, 1] of a per-keypoint softmax over the feature map."""

    def __init__(self, in_ch: int, num_kp: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_ch, num_kp, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)  # N,K,H,W
        n, k, hh, ww = h.shape
        attn = F.softmax(h.reshape(n, k, hh * ww), dim=-1)
        ys = torch.linspace(-1.0, 1.0, hh, device=x.device, dtype=attn.dtype)
        xs = torch.linspace(-1.0, 1.0, ww, device=x.device, dtype=attn.dtype)
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        ex = (attn * gx.reshape(1, 1, -1)).sum(-1)
        ey = (attn * gy.reshape(1, 1, -1)).sum(-1)
        return torch.cat([ex, ey], dim=-1)  # N, 2K


class ImageEncoder(nn.Module):
    """Per-camera trunk: stem conv -> FiLM residual blocks -> spatial softmax -> linear.

    The stem depends on ``cfg.image_profile``. "resnet_t": 5x5/stride-2 conv (84 -> 42 px),
    then residual stages that halve the map down to ~16 px. "lite": a 4x4/stride-4 patch
    conv (84 -> 21 px), then the same stages (one, 21 -> 11 px, at the default widths).
    Profiled (torch.profiler, 2 CPU threads, batch 32 x window 5 x 2 cameras), a ResNet-T
    BC step spends ~76 % in convolutions (55 % backward), mostly on the 42 px maps of the
    stem and first stage; the patch stem never computes that resolution.
    """

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        chans = cfg.conv_channels
        kernel, stride, pad = (4, 4, 0) if cfg.image_profile == "lite" else (5, 2, 2)
        self.stem = nn.Sequential(
            nn.Conv2d(3, chans[0], kernel, stride, pad, bias=False),
            nn.GroupNorm(_groups(chans[0]), chans[0]),
            nn.ReLU(),
        )
        size = (cfg.image_size + 2 * pad - kernel) // stride + 1
        blocks = []
        prev = chans[0]
        for c in chans[1:] or (chans[0],):
            stride = 2 if size > 16 else 1  # stop downsampling at ~16 px for keypoint detail
            size = (size + stride - 1) // stride
            blocks.append(FiLMResBlock(prev, c, stride, cfg.embed_dim))
            prev = c
        self.blocks = nn.ModuleList(blocks)
        self.keypoints = SpatialSoftmax(prev, cfg.num_keypoints)
        self.out = nn.Linear(2 * cfg.num_keypoints, cfg.embed_dim)

    def trunk(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Feature maps (N, C, h, w) of images x (N, 3, H, W) in [0, 1]."""
        h = self.stem(x)
        for block in self.blocks:
            h = block(h, cond)
        return h

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return self.out(self.keypoints(self.trunk(x, cond)))


class PretrainedImageEncoder(nn.Module):
    """Per-camera encoder on a pretrained backbone: trunk -> 1x1 adapter conv with FiLM
    from the text -> [spatial-softmax keypoints, channel means] -> linear.

    Frozen (``cfg.freeze_backbone``): the trunk is the process's shared :class:`FrozenTrunk`,
    held outside the module tree, so the state dict, ``parameters()`` and federation hold
    only the adapter onward; its features come from the cache. Fine-tuned: the trunk is a
    submodule (``trunk.backbone.*``) that trains and federates. The text conditions the
    adapter, after the trunk, so frozen features stay independent of the instruction.
    """

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        args = (cfg.vision_backbone, cfg.backbone_weights, cfg.backbone_image_size)
        self.frozen: FrozenTrunk | None = None
        if cfg.freeze_backbone:
            self.frozen = frozen_trunk(*args, cfg.backbone_cache_frames)
            channels = self.frozen.out_channels
        else:
            self.trunk = PretrainedTrunk(*args)
            channels = self.trunk.out_channels
        width = cfg.conv_channels[-1]
        self.adapter = nn.Conv2d(channels, width, 1, bias=False)
        self.norm = nn.GroupNorm(_groups(width), width)
        self.film = nn.Linear(cfg.embed_dim, 2 * width)
        self.keypoints = SpatialSoftmax(width, cfg.num_keypoints)
        # Keypoints say where, channel means what: a pretrained map is coarse (ResNet-18 at
        # 84 px: 3x3, DINOv2: 6x6; 1x1 below 64 px), and its channels carry the semantics
        # (open gripper, grasped object) that keypoint positions alone drop.
        self.out = nn.Linear(2 * cfg.num_keypoints + width, cfg.embed_dim)

    def backbone_features(self, x: torch.Tensor) -> torch.Tensor:
        """The backbone's feature maps (N, C, h, w) of images x (N, 3, H, W) in [0, 1]."""
        return self.frozen(x) if self.frozen is not None else self.trunk(x)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.adapter(self.backbone_features(x)))
        gamma, beta = self.film(cond).chunk(2, dim=-1)
        h = F.relu(h * (1.0 + gamma[:, :, None, None]) + beta[:, :, None, None])
        return self.out(torch.cat([self.keypoints(h), h.mean(dim=(2, 3))], dim=-1))


def image_encoder(cfg: PolicyConfig) -> nn.Module:
    """The camera encoder ``cfg.vision_backbone`` asks for (same call signature)."""
    return ImageEncoder(cfg) if cfg.vision_backbone == SCRATCH else PretrainedImageEncoder(cfg)


class TemporalTransformer(nn.Module):
    """Block-causal transformer over (T steps x M tokens); returns the action token per step."""

    def __init__(self, cfg: PolicyConfig, num_tokens: int) -> None:
        super().__init__()
        e = cfg.embed_dim
        self.action_token = nn.Parameter(torch.zeros(e))
        self.modality_embed = nn.Parameter(torch.randn(num_tokens + 1, e) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(cfg.window, e) * 0.02)
        layer = nn.TransformerEncoderLayer(
            e,
            cfg.transformer_heads,
            cfg.transformer_ff,
            cfg.dropout,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, cfg.transformer_layers, enable_nested_tensor=False
        )
        self.norm = nn.LayerNorm(e)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, t, m, e = tokens.shape  # m excludes the action token
        if t > self.pos_embed.shape[0]:
            raise ValueError(f"window {t} exceeds the configured window {self.pos_embed.shape[0]}")
        act = self.action_token.expand(b, t, 1, e)
        x = torch.cat([act, tokens], dim=2) + self.modality_embed[None, None]
        x = x + self.pos_embed[None, :t, None]
        x = x.reshape(b, t * (m + 1), e)
        step = torch.arange(t, device=x.device).repeat_interleave(m + 1)
        mask = step[None, :] > step[:, None]  # True = may not attend (future steps)
        y = self.norm(self.encoder(x, mask=mask))
        return y.reshape(b, t, m + 1, e)[:, :, 0]


class GMMHead(nn.Module):
    """Mixture-of-Gaussians action head: softplus scales + min_std, optional tanh means."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        e, k, a = cfg.embed_dim, cfg.num_modes, cfg.action_dim
        self.k, self.a = k, a
        self.mlp = nn.Sequential(nn.Linear(e, e), nn.ReLU())
        self.mean = nn.Linear(e, k * a)
        self.scale = nn.Linear(e, k * a)
        self.logits = nn.Linear(e, k)
        self.min_std = cfg.min_std
        self.tanh_means = cfg.tanh_means
        # Spread the initial modes so the mixture does not start collapsed.
        nn.init.uniform_(self.mean.bias, -0.5, 0.5)

    def forward(self, h: torch.Tensor) -> GMMParams:
        z = self.mlp(h)
        means = self.mean(z).unflatten(-1, (self.k, self.a))
        if self.tanh_means:
            means = torch.tanh(means)
        scales = F.softplus(self.scale(z).unflatten(-1, (self.k, self.a))) + self.min_std
        return GMMParams(means, scales, self.logits(z))

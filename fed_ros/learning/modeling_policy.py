"""Onboard multimodal GMM policy in the style of LIBERO's ResNet-T, scaled for CPU training.

Per time step every modality is encoded into one ``embed_dim`` token: the instruction (text
MLP over the built-in embedding), each camera (residual conv trunk with FiLM language
conditioning -> spatial softmax -> linear), joints and gripper (MLPs); the low-dim variant
replaces the cameras by object-state and end-effector-pose MLPs. A learnable action token
joins them; a block-causal temporal transformer (prefix ``temporal.``) runs over the window
and the action token of each step feeds a 5-mode GMM head (prefix ``head.``).

Normalisation of low-dim inputs uses buffers (``normalizer.*``) that are part of the state
dict but never trained: they are fixed when the fleet's common initial model is made
(:func:`initial_state_dict`), so every robot normalises identically and aggregation leaves
them unchanged. Images are scaled by 1/255; actions are already in [-1, 1].

Batch layout (training and ``features``): ``text`` (B, text_dim) float32; per observation key
of ``fed_ros.core.episode`` an array (B, T, ...): images (B,T,H,W,3) uint8, low-dim float32;
``actions`` (B,T,A); optional ``valid`` (B,T) bool (False on start-of-episode padding);
or, for images, the pooled layout of ``DemoDataset.batch``: each camera (U,H,W,3) holds
every distinct frame once and ``image_index`` (B,T) int gives each step's frame in that
pool (windows of consecutive frames overlap, so each distinct frame is encoded once).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fed_ros.core import episode as ep
from fed_ros.learning.configuration_policy import (EEF_DIM, GRIPPER_DIM, JOINT_DIM,
                                                   PolicyConfig)
from fed_ros.learning.losses import GMMParams, bc_nll, gmm_mode, gmm_sample
from fed_ros.learning.text import encode_instruction

# Low-dim keys that are normalised, with their widths and physical default statistics
# (mean, std) used when no data are given at initialisation.
LOWDIM_SPECS: dict[str, tuple[int, float, float]] = {
    ep.JOINT_POS: (JOINT_DIM, 0.0, 1.0),  # radians
    ep.GRIPPER_QPOS: (GRIPPER_DIM, 0.0, 0.02),  # finger travel is a few cm
    ep.EEF_POS: (3, 0.0, 0.5),  # metres in the base frame
    ep.EEF_QUAT: (4, 0.0, 1.0),  # unit quaternion
    ep.OBJECT_STATE: (ep.OBJECT_STATE_DIM, 0.0, 1.0),
}


@dataclass
class PolicyOutput:
    """Everything one forward pass yields: per-modality features (B,T,E), action-token
    embeddings (B,T,E) (the penultimate layer) and the GMM parameters."""

    features: dict[str, torch.Tensor]
    embedding: torch.Tensor
    gmm: GMMParams


class Normalizer(nn.Module):
    """Fixed (non-trained) per-key mean/std buffers for low-dim inputs."""

    def __init__(self) -> None:
        super().__init__()
        for key, (dim, mean, std) in LOWDIM_SPECS.items():
            self.register_buffer(f"{key}_mean", torch.full((dim,), float(mean)))
            self.register_buffer(f"{key}_std", torch.full((dim,), float(std)))

    def forward(self, key: str, x: torch.Tensor) -> torch.Tensor:
        return (x - getattr(self, f"{key}_mean")) / getattr(self, f"{key}_std")


def _mlp(in_dim: int, hidden: int, out_dim: int) -> nn.Sequential:
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
        self.skip = (nn.Identity() if in_ch == out_ch and stride == 1
                     else nn.Conv2d(in_ch, out_ch, 1, stride, bias=False))
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
        self.stem = nn.Sequential(nn.Conv2d(3, chans[0], kernel, stride, pad, bias=False),
                                  nn.GroupNorm(_groups(chans[0]), chans[0]), nn.ReLU())
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


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None,
                 groups: torch.Tensor | None = None) -> torch.Tensor:
    """Random-shift augmentation of uint8 windows (B,T,H,W,3): replicate-pad by ``pad`` and
    crop back at one random offset per sequence (the same shift for all T frames, so motion
    between frames is preserved). Applied by the trainer once per batch, so the teacher and
    the student see identical inputs.

    ``groups`` (B,) ints: sequences with equal group share one shift. The trainer passes
    each window's episode, so a frame that appears in several windows of a batch is
    shifted identically everywhere and the policy can encode it once (``image_index``).
    Pad-and-crop is done as integer slice copies of the uint8 pixels plus edge
    replication: no float copy, no padded intermediate (measured on 1 thread: 4-8 ms per
    camera at B=32, T=5, 84 px, against 46 ms for a clamped-index gather).
    """
    if pad <= 0:
        return images
    b, t, h, w, c = images.shape
    gen_dev = generator.device if generator is not None else "cpu"
    if groups is None:
        group_of = list(range(b))
        n_groups = b
    else:
        uniq, inverse = torch.unique(torch.as_tensor(groups).reshape(-1), return_inverse=True)
        if inverse.shape[0] != b:
            raise ValueError(f"groups must have one entry per sequence ({b}), "
                             f"got {tuple(torch.as_tensor(groups).shape)}")
        group_of, n_groups = inverse.tolist(), len(uniq)
    offs = torch.randint(0, 2 * pad + 1, (n_groups, 2), generator=generator,
                         device=gen_dev).tolist()
    out = torch.empty_like(images)
    i = 0
    while i < b:  # runs of consecutive sequences with one group are shifted in one go
        j = i + 1
        while j < b and group_of[j] == group_of[i]:
            j += 1
        dy, dx = (o - pad for o in offs[group_of[i]])  # out[y, x] = in[clamp(y+dy), clamp(x+dx)]
        src, dst = images[i:j], out[i:j]  # n,T,H,W,3
        y0, y1 = max(-dy, 0), h - max(dy, 0)  # rows and columns with a source pixel
        x0, x1 = max(-dx, 0), w - max(dx, 0)
        dst[:, :, y0:y1, x0:x1] = src[:, :, y0 + dy:y1 + dy, x0 + dx:x1 + dx]
        # Replicate padding: the border rows/columns repeat the nearest copied one.
        if x0:
            dst[:, :, y0:y1, :x0] = dst[:, :, y0:y1, x0:x0 + 1]
        if x1 < w:
            dst[:, :, y0:y1, x1:] = dst[:, :, y0:y1, x1 - 1:x1]
        if y0:
            dst[:, :, :y0] = dst[:, :, y0:y0 + 1]
        if y1 < h:
            dst[:, :, y1:] = dst[:, :, y1 - 1:y1]
        i = j
    return out


class TemporalTransformer(nn.Module):
    """Block-causal transformer over (T steps x M tokens); returns the action token per step."""

    def __init__(self, cfg: PolicyConfig, num_tokens: int) -> None:
        super().__init__()
        e = cfg.embed_dim
        self.action_token = nn.Parameter(torch.zeros(e))
        self.modality_embed = nn.Parameter(torch.randn(num_tokens + 1, e) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(cfg.window, e) * 0.02)
        layer = nn.TransformerEncoderLayer(e, cfg.transformer_heads, cfg.transformer_ff,
                                           cfg.dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.transformer_layers,
                                             enable_nested_tensor=False)
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


class GMMPolicy(nn.Module):
    """Language-conditioned multimodal GMM policy (image or low-dim variant)."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e = cfg.embed_dim
        self.normalizer = Normalizer()
        self.text_encoder = _mlp(cfg.text_dim, e, e)
        if cfg.kind == "image":
            self.agentview_encoder = ImageEncoder(cfg)
            self.wrist_encoder = ImageEncoder(cfg)
        else:
            self.object_encoder = _mlp(cfg.object_state_dim, e, e)
            self.eef_encoder = _mlp(EEF_DIM, e, e)
        self.joint_encoder = _mlp(JOINT_DIM, e, e)
        self.gripper_encoder = _mlp(GRIPPER_DIM, e, e)
        self.temporal = TemporalTransformer(cfg, len(cfg.modalities))
        self.head = GMMHead(cfg)
        self._history: deque[dict[str, np.ndarray]] = deque(maxlen=cfg.window)

    # -- encoding ---------------------------------------------------------------------

    def _images(self, batch: dict[str, Any], key: str, pooled: bool) -> torch.Tensor:
        """Validated uint8 frames of one camera on the model's device: (B*T, H, W, 3), or
        the (U, H, W, 3) pool of distinct frames when ``pooled`` (batch has image_index)."""
        img = torch.as_tensor(batch[key])
        want = 4 if pooled else 5
        if img.ndim != want or img.shape[-1] != 3:
            layout = "(U,H,W,3) with image_index" if pooled else "(B,T,H,W,3)"
            raise ValueError(f"{key} must be {layout}, got shape {tuple(img.shape)}")
        s = self.cfg.image_size
        if img.shape[-3] != s or img.shape[-2] != s:
            raise ValueError(f"{key} is {img.shape[-3]}x{img.shape[-2]} but the policy expects "
                             f"image_size={s}")
        dev = self.text_encoder[0].weight.device
        return img.to(dev).reshape(-1, s, s, 3)

    def _image_pool(self, batch: dict[str, Any], text: torch.Tensor, t: int
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(index, first) for a pooled batch, None for (B,T,H,W,3) images.

        ``index`` (B*T,): each step's frame in the pool; ``first`` (U,): the B*T position of
        the first step showing each pool frame, whose window's instruction conditions it.
        """
        if "image_index" not in batch:
            return None
        b = text.shape[0]
        index = torch.as_tensor(batch["image_index"], device=text.device)
        if index.shape != (b, t) or index.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"image_index must be an integer (B={b}, T={t}) array, got "
                             f"{index.dtype} {tuple(index.shape)}")
        index = index.reshape(-1).long()
        n = len(torch.as_tensor(batch[ep.AGENTVIEW_IMAGE]))
        if index.min() < 0 or index.max() >= n or len(torch.unique(index)) != n:
            raise ValueError(f"image_index must use every one of the {n} pooled frames")
        pos = torch.arange(b * t, device=text.device)
        first = torch.full((n,), b * t, device=text.device, dtype=pos.dtype).scatter_reduce_(
            0, index, pos, reduce="amin")
        # FiLM conditions a frame on its window's instruction, so a pooled frame shared by
        # several windows must have one instruction (raw embedding rows compared).
        steps = text.repeat_interleave(t, dim=0)  # BT,text_dim
        if not torch.equal(steps, steps.index_select(0, first).index_select(0, index)):
            raise ValueError("image_index shares a frame between different instructions")
        return index, first

    def _encode_camera(self, name: str, frames: torch.Tensor, cond: torch.Tensor,
                       pool: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Features (B*T, E) of one camera: frames (N, H, W, 3) uint8 with N = B*T, or the
        U pooled frames; cond (B*T, E) per step."""
        enc = getattr(self, f"{name}_encoder")
        if pool is not None:
            if frames.shape[0] != len(pool[1]):
                raise ValueError(f"{name} pools {frames.shape[0]} frames but image_index "
                                 f"uses {len(pool[1])}")
            cond = cond.index_select(0, pool[1])  # U,E
        # Plain NCHW, not channels-last: GroupNorm's CPU kernel is 2.5x slower (fwd+bwd) on
        # channels-last maps, which outweighs the few percent the convolutions gain.
        x = frames.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        x = x.div_(255.0)  # N,3,H,W in [0, 1]
        out = enc(x, cond)
        return out if pool is None else out.index_select(0, pool[0])  # BT,E

    def _lowdim(self, batch: dict[str, Any], key: str) -> torch.Tensor:
        if key not in batch:
            raise ValueError(f"batch is missing observation {key!r}")
        dev = self.text_encoder[0].weight.device
        x = torch.as_tensor(batch[key], dtype=torch.float32, device=dev)
        want = LOWDIM_SPECS[key][0]
        if x.ndim != 3 or x.shape[-1] != want:
            raise ValueError(f"{key} must be (B,T,{want}), got shape {tuple(x.shape)}")
        return self.normalizer(key, x)

    def features(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Per-modality encoder features, each (B,T,embed_dim), in ``cfg.modalities`` order."""
        dev = self.text_encoder[0].weight.device
        joint = self._lowdim(batch, ep.JOINT_POS)
        b, t = joint.shape[:2]
        text = torch.as_tensor(batch["text"], dtype=torch.float32, device=dev)
        if text.shape != (b, self.cfg.text_dim):
            raise ValueError(f"text must be (B={b}, {self.cfg.text_dim}), got {tuple(text.shape)}")
        text_feat = self.text_encoder(text)  # B,E
        feats: dict[str, torch.Tensor] = {"text": text_feat[:, None].expand(b, t, -1)}
        if self.cfg.kind == "image":
            cond = text_feat.repeat_interleave(t, dim=0)  # BT,E: FiLM per frame
            pool = self._image_pool(batch, text, t)
            for name, key in (("agentview", ep.AGENTVIEW_IMAGE), ("wrist", ep.WRIST_IMAGE)):
                frames = self._images(batch, key, pooled=pool is not None)
                feats[name] = self._encode_camera(name, frames, cond, pool).reshape(b, t, -1)
        else:
            feats["object"] = self.object_encoder(self._lowdim(batch, ep.OBJECT_STATE))
            eef = torch.cat([self._lowdim(batch, ep.EEF_POS), self._lowdim(batch, ep.EEF_QUAT)], -1)
            feats["eef"] = self.eef_encoder(eef)
        feats["joint"] = self.joint_encoder(joint)
        feats["gripper"] = self.gripper_encoder(self._lowdim(batch, ep.GRIPPER_QPOS))
        return {m: feats[m] for m in self.cfg.modalities}

    def compute(self, batch: dict[str, Any]) -> PolicyOutput:
        """Full forward: features, penultimate embeddings and GMM parameters."""
        feats = self.features(batch)
        tokens = torch.stack([feats[m] for m in self.cfg.modalities], dim=2)  # B,T,M,E
        emb = self.temporal(tokens)
        # The GMM head runs in float32 even under autocast: bf16 means carry ~3 significant
        # digits, far coarser than the scales (down to min_std) the NLL divides by.
        with torch.autocast(device_type=emb.device.type, enabled=False):
            gmm = self.head(emb.float())
        return PolicyOutput(feats, emb, gmm)

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        """BC loss (GMM NLL, Eq. 4) and an info dict holding the ``PolicyOutput``."""
        out = self.compute(batch)
        actions = torch.as_tensor(batch["actions"], dtype=torch.float32,
                                  device=out.embedding.device)
        valid = batch.get("valid")
        if valid is not None:
            valid = torch.as_tensor(valid, device=out.embedding.device)
        loss = bc_nll(out.gmm.float(), actions, valid)
        return loss, {"output": out, "bc": loss.detach()}

    # -- closed loop -----------------------------------------------------------------

    def reset(self) -> None:
        """Forget the observation history (call at every episode start)."""
        self._history.clear()

    @torch.no_grad()
    def select_action(self, obs: dict[str, Any], sample: bool = False,
                      generator: torch.Generator | None = None) -> np.ndarray:
        """Action (ACTION_DIM,) for one step; obs holds per-step arrays plus ``instruction``
        (str) or ``text`` (text_dim,). Uses the last ``window`` observations."""
        if "text" in obs:
            text = np.asarray(obs["text"], dtype=np.float32)
        elif "instruction" in obs:
            text = encode_instruction(str(obs["instruction"]), self.cfg.text_dim)
        else:
            raise ValueError("obs needs an 'instruction' string or a 'text' embedding")
        keys = [ep.JOINT_POS, ep.GRIPPER_QPOS]
        keys += list(ep.IMAGE_KEYS) if self.cfg.kind == "image" else [
            ep.EEF_POS, ep.EEF_QUAT, ep.OBJECT_STATE]
        step = {}
        for key in keys:
            if key not in obs:
                raise ValueError(f"observation is missing {key!r}")
            step[key] = np.asarray(obs[key])
        if not self._history:
            # Pad the window at episode start by repeating the first frame (as in training).
            self._history.extend([step] * self.cfg.window)
        else:
            self._history.append(step)
        batch: dict[str, Any] = {"text": text[None]}
        for key in keys:
            arr = np.stack([h[key] for h in self._history])[None]
            batch[key] = arr if key in ep.IMAGE_KEYS else arr.astype(np.float32)
        was_training = self.training
        self.eval()
        try:
            gmm = self.compute(batch).gmm.float()
        finally:
            self.train(was_training)
        last = GMMParams(gmm.means[:, -1:], gmm.scales[:, -1:], gmm.logits[:, -1:])
        action = gmm_sample(last, generator) if sample else gmm_mode(last)
        return action[0, 0].clamp(-1.0, 1.0).cpu().numpy().astype(np.float32)


def build_policy(cfg: PolicyConfig, seed: int | None = None) -> GMMPolicy:
    """Construct the policy; with ``seed`` the initial weights are reproducible."""
    if not isinstance(cfg, PolicyConfig):
        raise ValueError(f"cfg must be a PolicyConfig, got {type(cfg).__name__}")
    if seed is None:
        return GMMPolicy(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return GMMPolicy(cfg)


def set_normalization(model: GMMPolicy, stats: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Write low-dim normalisation (mean, std) per key into the model's buffers."""
    for key, (mean, std) in stats.items():
        if key not in LOWDIM_SPECS:
            raise ValueError(f"no normalisation buffer for key {key!r}")
        dim = LOWDIM_SPECS[key][0]
        mean = np.asarray(mean, dtype=np.float32).reshape(-1)
        std = np.asarray(std, dtype=np.float32).reshape(-1)
        if mean.shape != (dim,) or std.shape != (dim,):
            raise ValueError(f"stats for {key!r} must have shape ({dim},), got "
                             f"{mean.shape} and {std.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError(f"stats for {key!r} must be finite with std > 0")
        getattr(model.normalizer, f"{key}_mean").copy_(torch.from_numpy(mean))
        getattr(model.normalizer, f"{key}_std").copy_(torch.from_numpy(std))

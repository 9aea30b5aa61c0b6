"""Onboard multimodal GMM policy in the style of LIBERO's ResNet-T, scaled for CPU training.

Per time step every modality is encoded into one ``embed_dim`` token: the instruction (text
MLP over the built-in embedding), each camera (residual conv trunk with FiLM language
conditioning -> spatial softmax -> linear; or a pretrained backbone, ``vision_backbone``),
joints and gripper (MLPs); the low-dim variant replaces the cameras by object-state and
end-effector-pose MLPs. A learnable action token joins them; a block-causal temporal
transformer (prefix ``temporal.``) runs over the window and the action token of each step
feeds a 5-mode GMM head (prefix ``head.``).

Normalisation of low-dim inputs uses buffers (``normalizer.*``) that are part of the state
dict but never trained: they are fixed when the fleet's common initial model is made
(:func:`initial_state_dict`), so every robot normalises identically and aggregation leaves
them unchanged. Images are scaled by 1/255; actions are already in [-1, 1].

Batch layout (training and ``features``): ``text`` (B, text_dim) float32; per observation key
of ``fed_ros.core.data.episode`` an array (B, T, ...): images (B,T,H,W,3) uint8, low-dim float32;
``actions`` (B,T,A); optional ``valid`` (B,T) bool (False on start-of-episode padding);
or, for images, the pooled layout of ``DemoDataset.batch``: each camera (U,H,W,3) holds
every distinct frame once and ``image_index`` (B,T) int gives each step's frame in that
pool (windows of consecutive frames overlap, so each distinct frame is encoded once).

The encoders, transformer and head are in :mod:`fed_ros.learning.policy_modules`; the
trainer's image augmentation in :mod:`fed_ros.learning.augmentation`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from fed_ros.core.data import episode as ep
from fed_ros.learning.configuration_policy import EEF_DIM, GRIPPER_DIM, JOINT_DIM, PolicyConfig
from fed_ros.learning.losses import GMMParams, bc_nll, gmm_mode, gmm_sample
from fed_ros.learning.policy_modules import GMMHead, TemporalTransformer, image_encoder, mlp
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


class GMMPolicy(nn.Module):
    """Language-conditioned multimodal GMM policy (image or low-dim variant)."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e = cfg.embed_dim
        self.normalizer = Normalizer()
        self.text_encoder = mlp(cfg.text_dim, e, e)
        if cfg.kind == "image":
            self.agentview_encoder = image_encoder(cfg)
            self.wrist_encoder = image_encoder(cfg)
            if cfg.use_object_state:  # opt-in object-state token (PolicyConfig.use_object_state)
                self.object_encoder = mlp(cfg.object_state_dim, e, e)
            if cfg.use_eef_state:  # opt-in end-effector token (PolicyConfig.use_eef_state)
                self.eef_encoder = mlp(EEF_DIM, e, e)
        else:
            self.object_encoder = mlp(cfg.object_state_dim, e, e)
            self.eef_encoder = mlp(EEF_DIM, e, e)
        self.joint_encoder = mlp(JOINT_DIM, e, e)
        self.gripper_encoder = mlp(GRIPPER_DIM, e, e)
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
            raise ValueError(
                f"{key} is {img.shape[-3]}x{img.shape[-2]} but the policy expects image_size={s}"
            )
        dev = self.text_encoder[0].weight.device
        return img.to(dev).reshape(-1, s, s, 3)

    def _image_pool(
        self, batch: dict[str, Any], text: torch.Tensor, t: int
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
            raise ValueError(
                f"image_index must be an integer (B={b}, T={t}) array, got "
                f"{index.dtype} {tuple(index.shape)}"
            )
        index = index.reshape(-1).long()
        n = len(torch.as_tensor(batch[ep.AGENTVIEW_IMAGE]))
        if index.min() < 0 or index.max() >= n or len(torch.unique(index)) != n:
            raise ValueError(f"image_index must use every one of the {n} pooled frames")
        pos = torch.arange(b * t, device=text.device)
        first = torch.full((n,), b * t, device=text.device, dtype=pos.dtype).scatter_reduce_(
            0, index, pos, reduce="amin"
        )
        # FiLM conditions a frame on its window's instruction, so a pooled frame shared by
        # several windows must have one instruction (raw embedding rows compared).
        steps = text.repeat_interleave(t, dim=0)  # BT,text_dim
        if not torch.equal(steps, steps.index_select(0, first).index_select(0, index)):
            raise ValueError("image_index shares a frame between different instructions")
        return index, first

    def _encode_camera(
        self,
        name: str,
        frames: torch.Tensor,
        cond: torch.Tensor,
        pool: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Features (B*T, E) of one camera: frames (N, H, W, 3) uint8 with N = B*T, or the
        U pooled frames; cond (B*T, E) per step."""
        enc = getattr(self, f"{name}_encoder")
        if pool is not None:
            if frames.shape[0] != len(pool[1]):
                raise ValueError(
                    f"{name} pools {frames.shape[0]} frames but image_index uses {len(pool[1])}"
                )
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
            if self.cfg.use_object_state:
                feats["object"] = self.object_encoder(self._lowdim(batch, ep.OBJECT_STATE))
        else:
            feats["object"] = self.object_encoder(self._lowdim(batch, ep.OBJECT_STATE))
        if self.cfg.use_eef_state:
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
        actions = torch.as_tensor(
            batch["actions"], dtype=torch.float32, device=out.embedding.device
        )
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
    def select_action(
        self, obs: dict[str, Any], sample: bool = False, generator: torch.Generator | None = None
    ) -> np.ndarray:
        """Action (ACTION_DIM,) for one step; obs holds per-step arrays plus ``instruction``
        (str) or ``text`` (text_dim,). Uses the last ``window`` observations."""
        if "text" in obs:
            text = np.asarray(obs["text"], dtype=np.float32)
        elif "instruction" in obs:
            text = encode_instruction(str(obs["instruction"]), self.cfg.text_dim)
        else:
            raise ValueError("obs needs an 'instruction' string or a 'text' embedding")
        keys = [ep.JOINT_POS, ep.GRIPPER_QPOS]
        keys += list(ep.IMAGE_KEYS) if self.cfg.kind == "image" else []
        keys += [ep.EEF_POS, ep.EEF_QUAT] if self.cfg.use_eef_state else []
        keys += [ep.OBJECT_STATE] if self.cfg.use_object_state else []
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
            raise ValueError(
                f"stats for {key!r} must have shape ({dim},), got {mean.shape} and {std.shape}"
            )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError(f"stats for {key!r} must be finite with std > 0")
        getattr(model.normalizer, f"{key}_mean").copy_(torch.from_numpy(mean))
        getattr(model.normalizer, f"{key}_std").copy_(torch.from_numpy(std))

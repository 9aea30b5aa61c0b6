"""Policy configuration: a validated dataclass (LeRobot/robomimic style).

The configuration fixes the policy's parameter manifest. Nothing in it depends on the task a
robot trains on (object state, action and text dimensions are global constants), so every
robot of a fleet that shares a ``PolicyConfig`` can federate the same tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from os import PathLike
from typing import Any

from fed_ros.core.data.episode import ACTION_DIM, OBJECT_STATE_DIM
from fed_ros.learning.backbones.specs import BACKBONE_SPECS, SCRATCH, VISION_BACKBONES

POLICY_KINDS = ("image", "lowdim")

# Camera trunk profiles (see ``policy_modules.ImageEncoder``), each with its default
# ``conv_channels``. "lite" is the CPU default: a 4x4/stride-4 patch stem and one FiLM
# residual stage, ~2.2M multiply-adds per 84x84 frame. "resnet_t" is the LIBERO
# ResNet-T-sized trunk (5x5/stride-2 stem, FiLM residual stages down to ~16 px, ~20M
# multiply-adds per frame), meant for GPUs: on 2 CPU threads it trains at ~1 step/s.
IMAGE_PROFILES: dict[str, tuple[int, ...]] = {
    "lite": (16, 32),
    "resnet_t": (32, 32, 64),
}

# Modalities whose encoder features `features(batch)` exposes (the subspace-distillation set).
IMAGE_MODALITIES = ("text", "agentview", "wrist", "joint", "gripper")
LOWDIM_MODALITIES = ("text", "object", "eef", "joint", "gripper")

JOINT_DIM = 7
GRIPPER_DIM = 2
EEF_DIM = 7  # eef_pos (3) + eef_quat xyzw (4)


@dataclass
class PolicyConfig:
    """Architecture of the onboard GMM policy (LIBERO ResNet-T style, scaled for CPU training).

    Attributes:
        kind: "image" (agentview + wrist cameras, FiLM language conditioning) or "lowdim"
            (object state + end-effector pose instead of images).
        image_size: square image side in pixels the image encoders expect (HxWx3 uint8 input).
        window: observation history length T fed to the temporal transformer.
        num_modes: GMM mixture components of the action head.
        embed_dim: token width of every modality encoder and of the transformer.
        text_dim: width of the built-in instruction embedding (see ``text.py``).
        image_profile: camera trunk layout, one of ``IMAGE_PROFILES``: "lite" (CPU
            default) or "resnet_t" (LIBERO ResNet-T-sized, for GPUs).
        conv_channels: channel widths of the trunk's stem and residual stages; None
            (default) takes the profile's widths.
        num_keypoints: spatial-softmax keypoints per camera (2 coordinates each).
        transformer_layers / transformer_heads / transformer_ff: temporal transformer size.
        dropout: dropout in the transformer and encoders (0 gives a deterministic forward).
        min_std: floor added to the softplus GMM scales so the NLL stays bounded.
        tanh_means: squash component means with tanh (actions live in [-1, 1]).
        random_shift: pixels of random-shift augmentation the trainer applies to image
            windows (0: off). None (default) takes 4, or 0 for a frozen pretrained backbone:
            a shifted frame is a new frame to the feature cache, so shifts would encode
            every frame of every batch again (~8-21 ms each on a CPU thread).
        use_object_state: whether ``object_state`` is a policy input (its own token). None
            (default) takes the kind's default: True for "lowdim" (it cannot work without
            it), False for "image" (the cameras see the scene), so existing manifests are
            unchanged. Real arms have no object state (it needs perception): their fleets
            set False (docs/arms.md); an image policy then ignores ``object_state`` if a
            batch carries one. True on an image policy adds an object-state token (a
            different manifest); False on a low-dim policy is rejected.
        use_eef_state: whether the end-effector pose (``eef_pos``, ``eef_quat``: the arm's
            forward kinematics, published on ``arm/eef_pose``) is a policy input (its own
            token). None (default) takes the kind's default: True for "lowdim", False for
            "image" (existing image manifests are unchanged). True on an image policy is
            robomimic's proprioception for image BC (eef pose + gripper): the cameras then
            only have to locate the object relative to a hand whose position the policy
            already knows (docs/learning.md measures it). False on a low-dim policy is
            rejected.
        vision_backbone: camera trunk of an image policy, one of ``VISION_BACKBONES``:
            "scratch" (default: the ``image_profile`` trunk, trained from random weights),
            "resnet18_imagenet" (torchvision's ImageNet ResNet-18), "dinov2_vits14"
            (self-supervised DINOv2 ViT-S/14) or "fleet" (the fleet's own encoder, trained
            and FedAvg'd by every robot: ``fleet_encoder``; ``backbone_weights`` names the
            file its stage wrote). A pretrained backbone reads its published
            weights file, never downloads it (docs/learning.md, "Choosing a visual
            encoder"); a trainable adapter (1x1 conv to ``conv_channels[-1]`` channels,
            FiLM from the text) feeds the spatial-softmax keypoints and channel means.
        backbone_weights: path of the pretrained weights file (.pth or .safetensors); None
            (default) reads torch.hub's cached copy, ``<torch.hub.get_dir()>/checkpoints/``.
        freeze_backbone: True (default): the pretrained weights stay fixed, are left out of
            the policy's state dict (nothing to federate) and each distinct frame's
            features are cached; False: the backbone fine-tunes and federates with the rest.
        backbone_image_size: side the frames are resized to before a pretrained backbone;
            None (default) takes ``image_size`` (for DINOv2 the nearest multiple of 14).
        backbone_cache_frames: bound on cached per-frame features of a frozen backbone (0:
            no cache); one cache per process, shared by both cameras.
        action_dim / object_state_dim: fixed by ``fed_ros.core.data.episode``; kept here so a
            checkpoint records them.
    """

    kind: str = "lowdim"
    image_size: int = 84
    window: int = 5
    num_modes: int = 5
    embed_dim: int = 64
    text_dim: int = 256
    image_profile: str = "lite"
    conv_channels: tuple[int, ...] | None = None
    num_keypoints: int = 32
    transformer_layers: int = 2
    transformer_heads: int = 4
    transformer_ff: int = 256
    dropout: float = 0.1
    min_std: float = 1e-4
    tanh_means: bool = True
    random_shift: int | None = None
    use_object_state: bool | None = None
    use_eef_state: bool | None = None
    vision_backbone: str = SCRATCH
    backbone_weights: str | None = None
    freeze_backbone: bool = True
    backbone_image_size: int | None = None
    backbone_cache_frames: int = 8192
    action_dim: int = ACTION_DIM
    object_state_dim: int = OBJECT_STATE_DIM

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"kind must be one of {POLICY_KINDS}, got {self.kind!r}")
        if self.image_profile not in IMAGE_PROFILES:
            raise ValueError(
                f"image_profile must be one of {tuple(IMAGE_PROFILES)}, got {self.image_profile!r}"
            )
        if self.conv_channels is None:
            # Resolved here, so equal architectures compare equal and the checkpoint
            # metadata (to_dict) names the widths explicitly.
            self.conv_channels = IMAGE_PROFILES[self.image_profile]
        self.conv_channels = tuple(int(c) for c in self.conv_channels)
        for name in (
            "image_size",
            "window",
            "num_modes",
            "embed_dim",
            "text_dim",
            "num_keypoints",
            "transformer_layers",
            "transformer_heads",
            "transformer_ff",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")
        if not self.conv_channels or any(c < 1 for c in self.conv_channels):
            raise ValueError(f"conv_channels must be positive ints, got {self.conv_channels!r}")
        if self.embed_dim % self.transformer_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by "
                f"transformer_heads {self.transformer_heads}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not self.min_std > 0.0:
            raise ValueError(f"min_std must be > 0, got {self.min_std!r}")
        if self.random_shift is None:
            frozen = self.vision_backbone != SCRATCH and self.freeze_backbone is True
            self.random_shift = 0 if frozen else 4
        if not isinstance(self.random_shift, int) or self.random_shift < 0:
            raise ValueError(f"random_shift must be an int >= 0, got {self.random_shift!r}")
        if self.use_object_state is None:
            self.use_object_state = self.kind == "lowdim"
        if not isinstance(self.use_object_state, bool):
            raise ValueError(f"use_object_state must be a bool, got {self.use_object_state!r}")
        if self.kind == "lowdim" and not self.use_object_state:
            raise ValueError(
                "use_object_state=False needs kind='image': the low-dim policy's only "
                "view of the scene is object_state (a real arm without perception "
                "trains an image policy)"
            )
        if self.use_eef_state is None:
            self.use_eef_state = self.kind == "lowdim"
        if not isinstance(self.use_eef_state, bool):
            raise ValueError(f"use_eef_state must be a bool, got {self.use_eef_state!r}")
        if self.kind == "lowdim" and not self.use_eef_state:
            raise ValueError(
                "use_eef_state=False needs kind='image': the low-dim policy always reads "
                "the end-effector pose"
            )
        self._check_backbone()
        if self.action_dim != ACTION_DIM:
            raise ValueError(f"action_dim must be {ACTION_DIM} (fleet-wide), got {self.action_dim}")
        if self.object_state_dim != OBJECT_STATE_DIM:
            raise ValueError(
                f"object_state_dim must be {OBJECT_STATE_DIM} (fleet-wide), "
                f"got {self.object_state_dim}"
            )

    def _check_backbone(self) -> None:
        if self.vision_backbone not in VISION_BACKBONES:
            raise ValueError(
                f"vision_backbone must be one of {VISION_BACKBONES}, got {self.vision_backbone!r}"
            )
        if not isinstance(self.freeze_backbone, bool):
            raise ValueError(f"freeze_backbone must be a bool, got {self.freeze_backbone!r}")
        cache = self.backbone_cache_frames
        if not isinstance(cache, int) or isinstance(cache, bool) or cache < 0:
            raise ValueError(f"backbone_cache_frames must be an int >= 0, got {cache!r}")
        if self.vision_backbone == SCRATCH:
            # Settings the scratch trunk would silently ignore are mistakes: reject them.
            for name in ("backbone_weights", "backbone_image_size"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} needs a pretrained vision_backbone, "
                        f"got vision_backbone={SCRATCH!r}"
                    )
            return
        if self.kind != "image":
            raise ValueError(
                f"vision_backbone={self.vision_backbone!r} needs kind='image', got {self.kind!r}"
            )
        if isinstance(self.backbone_weights, PathLike):
            self.backbone_weights = str(self.backbone_weights)  # JSON-safe in to_dict
        if self.backbone_weights is not None and (
            not isinstance(self.backbone_weights, str) or not self.backbone_weights
        ):
            raise ValueError(
                f"backbone_weights must be a file path or None, got {self.backbone_weights!r}"
            )
        spec = BACKBONE_SPECS[self.vision_backbone]
        if self.backbone_image_size is None:
            # Resolved here, like conv_channels, so the checkpoint names the size used.
            self.backbone_image_size = spec.default_input_size(self.image_size)
        size = self.backbone_image_size
        if (
            not isinstance(size, int)
            or isinstance(size, bool)
            or size < spec.min_size
            or size % spec.patch
        ):
            raise ValueError(
                f"backbone_image_size for {spec.name} must be a multiple of {spec.patch} "
                f">= {spec.min_size}, got {size!r}"
            )

    @property
    def modalities(self) -> tuple[str, ...]:
        """Encoder modalities of this variant, in token order."""
        if self.kind == "lowdim":
            return LOWDIM_MODALITIES
        # An image policy's object-state and end-effector tokens (opt-in) follow the
        # cameras, in the low-dim policy's order.
        opt_in = ("object",) * self.use_object_state + ("eef",) * self.use_eef_state
        return IMAGE_MODALITIES[:3] + opt_in + IMAGE_MODALITIES[3:]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["conv_channels"] = list(self.conv_channels)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PolicyConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ValueError naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown PolicyConfig field(s): {unknown}")
        return cls(**data)

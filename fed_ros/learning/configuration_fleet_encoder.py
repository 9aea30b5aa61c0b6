"""Settings of the fleet's shared visual encoder (LeRobot's configuration_* split: validated
without importing torch, so a fleet file or a benchmark profile can hold one)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fed_ros.core.data.episode import IMAGE_KEYS

# "proprio": predict the arm's own joint positions, finger positions and end-effector pose
# from one frame (every real arm records these beside its cameras). "temporal": InfoNCE
# between two frames of one episode a few steps apart (needs nothing but the frames).
# "masked": reconstruct the hidden square patches of a frame from the rest (MAE's objective,
# He et al. 2022, on a conv trunk: the masked patches are set to the mean colour), so the
# trunk has to encode the whole scene, the object included, not only the arm.
OBJECTIVES = ("proprio", "temporal", "masked")
# Fields only the masked objective reads: left out of the other objectives' identity, so an
# encoder stage stored before the masked objective existed keeps its key.
MASKED_FIELDS = ("mask_ratio", "mask_patch")


@dataclass
class FleetEncoderConfig:
    """How every robot trains the fleet encoder and how often the fleet averages it.

    Attributes:
        objective: one of ``OBJECTIVES``.
        cameras: the episodes' image keys the encoder trains on (one encoder for all of them,
            as the frozen trunk serves both of a policy's cameras).
        image_size: side the frames are resized to, as the policy's ``backbone_image_size``.
        rounds: FedAvg rounds of one encoder stage.
        local_steps: optimiser steps per robot per encoder round.
        refresh_every: policy rounds between encoder stages after the first (0: the encoder is
            trained once, before the policy rounds).
        batch_size: frames (proprio) or frame pairs (temporal) per step.
        lr: Adam learning rate.
        num_keypoints: spatial-softmax keypoints of the objective head.
        temporal_offset: a temporal pair's frames are 1..this many steps apart.
        temperature: InfoNCE temperature.
        mask_ratio: share of a frame's patches hidden by the masked objective (MAE: 0.75 for
            ViT patches; a conv trunk sees across patch borders, so half hides as much).
        mask_patch: side of a masked patch in pixels at ``image_size`` (84 / 12: a 7 x 7 grid).
        seed: initial weights of the fleet's first encoder (the server's, like theta0).
    """

    objective: str = "proprio"
    cameras: tuple[str, ...] = IMAGE_KEYS
    image_size: int = 84
    rounds: int = 3
    local_steps: int = 100
    refresh_every: int = 0
    batch_size: int = 64
    lr: float = 1e-3
    num_keypoints: int = 32
    temporal_offset: int = 3
    temperature: float = 0.1
    mask_ratio: float = 0.5
    mask_patch: int = 12
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        self.cameras = tuple(self.cameras)
        if not self.cameras or any(c not in IMAGE_KEYS for c in self.cameras):
            raise ValueError(
                f"cameras must be a non-empty subset of {IMAGE_KEYS}, got {self.cameras!r}"
            )
        for name, low in (
            ("image_size", 8),
            ("rounds", 1),
            ("local_steps", 1),
            ("refresh_every", 0),
            ("batch_size", 2),
            ("num_keypoints", 1),
            ("temporal_offset", 1),
            ("mask_patch", 1),
            ("seed", 0),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        for name in ("lr", "temperature"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
        ratio = self.mask_ratio
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio < 1:
            raise ValueError(f"mask_ratio must be a number in (0, 1), got {ratio!r}")

    def identity(self) -> dict[str, Any]:
        """The fields that determine what a stage trains (``to_dict`` less the masked
        objective's fields under another objective): what stored stages are keyed by."""
        out = self.to_dict()
        if self.objective != "masked":
            for name in MASKED_FIELDS:
                del out[name]
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields (cameras as a list)."""
        out = dataclasses.asdict(self)
        out["cameras"] = list(self.cameras)
        return out

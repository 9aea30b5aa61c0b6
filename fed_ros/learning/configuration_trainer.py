"""Local-training settings (LeRobot's configuration_* split: a validated dataclass beside the
trainer that reads it, so benchmarks, robots and tests build one without importing torch code
paths they do not run)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from fed_ros.core.rounds.config import (
    PAPER_LAMBDA_ACT,
    PAPER_LAMBDA_SUB,
    PAPER_USE_ACT,
    PAPER_USE_SUB,
)
from fed_ros.learning.device import resolve_device

# "constant" is the paper's; "cosine" decays over the steps of one round (see lr_factor).
LR_SCHEDULES = ("constant", "cosine")


def lr_factor(schedule: str, step: int, total_steps: int, warmup: int, final_ratio: float) -> float:
    """Multiplier of the base learning rate before optimiser step ``step`` (0-based).

    Linear warm-up over ``warmup`` steps, then constant or a half cosine from 1 down to
    ``final_ratio`` at the last step. Each round restarts the schedule: a robot trains a
    fresh student from the cluster model every round.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(total_steps - warmup - 1, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


DATA_ON_DEVICE = ("auto", "on", "off")


@dataclass
class TrainerConfig:
    """Local-training settings; defaults are the FedDRMan paper's (Sec. IV).

    Attributes:
        lambda_sub: weight lambda_m of every modality's L_sub (default: the paper's,
            PAPER_LAMBDA_SUB).
        lambda_modality: per-modality overrides of lambda_sub, e.g. {"text": 0.0}.
        lambda_act: weight of L_act (default: the paper's, PAPER_LAMBDA_ACT).
        rank: subspace rank r (paper: 48), capped at min(d_m, N) per modality.
        sub_noise_std: pre-SVD perturbation std (paper: 0.01).
        sub_reduction: "sum" = Frobenius norm as in Eq. 6; "mean" divides by N = B*T.
        sub_grad_through_projector: differentiate the student projector P^k (paper: yes,
            gradients propagate through everything the student computes).
        act_logp_clamp: |log pi| clamp for L_act.
        lr / weight_decay / clip / batch_size / epochs: AdamW, grad-norm clip, batch, epochs.
        lr_schedule: "constant" (the paper's) or "cosine": the learning rate decays from lr
            to lr * lr_final_ratio over the round's steps, after lr_warmup_steps of linear
            warm-up (docs/learning.md compares them on Lift from cameras).
        max_steps: stop after this many optimiser steps (None: full epochs).
        prox_mu: FedProx mu (0: off; paper baseline 1e-3).
        use_sub / use_act: ablation switches (default: on, the paper's objective).
        val_fraction: episodes held out to report val_nll (0: none).
        device: "auto" (CUDA with bf16 autocast when present), "cpu" or "cuda[:i]".
        amp: allow autocast on CUDA.
        data_on_device: keep the demonstrations on the training device and build batches
            there (`fed_ros.learning.device_dataset`): "auto" (on CUDA), "on" or "off".
        seed: all random streams derive from it.
        progress: show a tqdm bar.
    """

    lambda_sub: float = PAPER_LAMBDA_SUB
    lambda_modality: dict[str, float] = field(default_factory=dict)
    lambda_act: float = PAPER_LAMBDA_ACT
    rank: int = 48
    sub_noise_std: float = 0.01
    sub_reduction: str = "sum"
    sub_grad_through_projector: bool = True
    act_logp_clamp: float = 50.0
    lr: float = 1e-4
    lr_schedule: str = "constant"
    lr_warmup_steps: int = 0
    lr_final_ratio: float = 0.0
    weight_decay: float = 1e-4
    clip: float = 100.0
    batch_size: int = 32
    epochs: int = 1
    max_steps: int | None = None
    prox_mu: float = 0.0
    use_sub: bool = PAPER_USE_SUB
    use_act: bool = PAPER_USE_ACT
    val_fraction: float = 0.1
    device: str = "auto"
    amp: bool = True
    data_on_device: str = "auto"
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("lambda_sub", "lambda_act", "sub_noise_std", "weight_decay", "prox_mu"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("lr", "clip", "act_logp_clamp"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("rank", "batch_size", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_steps is not None and (
            not isinstance(self.max_steps, int) or self.max_steps < 1
        ):
            raise ValueError(f"max_steps must be None or a positive int, got {self.max_steps!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not isinstance(self.lr_warmup_steps, int) or self.lr_warmup_steps < 0:
            raise ValueError(f"lr_warmup_steps must be an int >= 0, got {self.lr_warmup_steps!r}")
        if not (
            isinstance(self.lr_final_ratio, (int, float)) and 0.0 <= self.lr_final_ratio <= 1.0
        ):
            raise ValueError(f"lr_final_ratio must be in [0, 1], got {self.lr_final_ratio!r}")
        if self.sub_reduction not in ("sum", "mean"):
            raise ValueError(f"sub_reduction must be 'sum' or 'mean', got {self.sub_reduction!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}")
        for key, value in self.lambda_modality.items():
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"lambda_modality[{key!r}] must be >= 0, got {value!r}")
        if self.data_on_device not in DATA_ON_DEVICE:
            raise ValueError(
                f"data_on_device must be one of {DATA_ON_DEVICE}, got {self.data_on_device!r}"
            )
        resolve_device(self.device)  # raises ValueError on a bad name

    @property
    def uses_teacher(self) -> bool:
        """Whether any distillation term needs the frozen teacher."""
        return self.use_sub or self.use_act

    def weight_of(self, modality: str) -> float:
        """lambda_m for one modality."""
        return float(self.lambda_modality.get(modality, self.lambda_sub))

    def replace(self, **changes: Any) -> "TrainerConfig":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

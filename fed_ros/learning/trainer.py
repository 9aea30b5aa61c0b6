"""One round of local training with FedDRMan distillation (methods.md Eq. 3-9).

Template (robomimic style): the constructor (student from the cluster model, frozen teacher
copy), then per batch ``process_batch`` -> ``forward`` -> ``_compute_losses`` ->
``_train_step``. Every term is switchable for ablations: ``use_sub`` (L_sub), ``use_act``
(L_act), ``prox_mu`` (FedProx).
With all of them off no teacher is built and the loop is plain behaviour cloning.

Randomness is split into independent streams so switching a loss on or off never changes
the others: batch order (numpy, ``seed``), augmentation (``seed + 1``), pre-SVD noise
(``seed + 2``), teacher action samples (``seed + 3``), dropout (global torch RNG, ``seed``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from fed_ros.core.data import episode as ep
from fed_ros.core.data.episode import Episode
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.configuration_trainer import TrainerConfig, lr_factor
from fed_ros.learning.device_dataset import DeviceDataset
from fed_ros.learning.dataset import DemoDataset, split_episodes
from fed_ros.learning.device import autocast, resolve_device, seed_everything
from fed_ros.learning.losses import action_distillation_loss, bc_nll, proximal_term, subspace_losses
from fed_ros.learning.augmentation import random_shift
from fed_ros.learning.modeling_policy import GMMPolicy, PolicyOutput, build_policy
from fed_ros.learning.weights import StateDict, load_state_dict_into, policy_to_state_dict


@dataclass
class LocalResult:
    """Outcome of one local round: trained parameters, training-sample count, metrics."""

    params: StateDict
    num_samples: int
    metrics: dict[str, float]


def _split_val(
    episodes: Sequence[Episode], tc: TrainerConfig
) -> tuple[list[Episode], list[Episode]]:
    ok = [e for e in episodes if e.success]
    if tc.val_fraction > 0 and len(ok) >= 2:
        return split_episodes(ok, tc.val_fraction, seed=tc.seed)
    return ok, []


class LocalTrainer:
    """Student/teacher pair for one round; ``run`` executes the optimisation."""

    def __init__(
        self, start: StateDict, policy_cfg: PolicyConfig, trainer_cfg: TrainerConfig
    ) -> None:
        self.pc, self.tc = policy_cfg, trainer_cfg
        self.device = resolve_device(trainer_cfg.device)
        seed_everything(trainer_cfg.seed)
        # Eq. 3: student <- theta_g, teacher <- theta_g, no gradient into the teacher.
        self.student: GMMPolicy = load_state_dict_into(build_policy(policy_cfg, seed=0), start)
        self.student.to(self.device).train()
        self.teacher: GMMPolicy | None = None
        if trainer_cfg.uses_teacher:
            self.teacher = load_state_dict_into(build_policy(policy_cfg, seed=0), start)
            self.teacher.to(self.device).eval()
            self.teacher.requires_grad_(False)
        self.global_params: list[tuple[torch.Tensor, torch.Tensor]] = []
        if trainer_cfg.prox_mu > 0:
            self.global_params = [(p, p.detach().clone()) for p in self.student.parameters()]
        self.optimizer = torch.optim.AdamW(
            self.student.parameters(), lr=trainer_cfg.lr, weight_decay=trainer_cfg.weight_decay
        )

        def gen(offset: int) -> torch.Generator:
            g = torch.Generator(device=self.device)
            g.manual_seed(trainer_cfg.seed + offset)
            return g

        self.aug_gen, self.noise_gen, self.act_gen = gen(1), gen(2), gen(3)
        self.use_amp = trainer_cfg.amp and self.device.type == "cuda"

    # -- template steps ------------------------------------------------------------

    def process_batch(self, data: DemoDataset | DeviceDataset, idx: np.ndarray) -> dict[str, Any]:
        batch = data.torch_batch(idx, self.device)
        if self.pc.kind == "image" and self.pc.random_shift > 0:
            # One shift per episode and camera: every frame of a window moves alike (motion
            # is preserved) and a pooled frame shared by several windows is shifted once.
            for key in ep.IMAGE_KEYS:
                frames = batch[key][:, None]  # U,1,H,W,3
                batch[key] = random_shift(
                    frames, self.pc.random_shift, self.aug_gen, groups=batch["image_episode"]
                )[:, 0]
        return batch

    def forward(self, batch: dict[str, Any]) -> tuple[PolicyOutput, PolicyOutput | None]:
        with autocast(self.device, self.use_amp):
            out_s = self.student.compute(batch)
            out_t = None
            if self.teacher is not None:
                with torch.no_grad():
                    out_t = self.teacher.compute(batch)
        return out_s, out_t

    def _compute_losses(
        self, batch: dict[str, Any], out_s: PolicyOutput, out_t: PolicyOutput | None
    ) -> dict[str, torch.Tensor]:
        tc = self.tc
        valid = batch["valid"]
        losses: dict[str, torch.Tensor] = {"bc": bc_nll(out_s.gmm.float(), batch["actions"], valid)}
        total = losses["bc"]
        if tc.use_sub and out_t is not None:
            mods = [m for m in self.pc.modalities if tc.weight_of(m) > 0.0]
            if mods:
                # All modality features share embed_dim: one batched decomposition call.
                l_sub = subspace_losses(
                    torch.stack([out_t.features[m].reshape(-1, self.pc.embed_dim) for m in mods]),
                    torch.stack([out_s.features[m].reshape(-1, self.pc.embed_dim) for m in mods]),
                    rank=tc.rank,
                    noise_std=tc.sub_noise_std,
                    generator=self.noise_gen,
                    reduction=tc.sub_reduction,
                    grad_through_projector=tc.sub_grad_through_projector,
                )
                for i, m in enumerate(mods):
                    losses[f"sub_{m}"] = l_sub[i]
                    total = total + tc.weight_of(m) * l_sub[i]
        if tc.use_act and out_t is not None:
            losses["act"] = action_distillation_loss(
                out_t.gmm.float(), out_s.gmm.float(), self.act_gen, tc.act_logp_clamp, valid
            )
            total = total + tc.lambda_act * losses["act"]
        if tc.prox_mu > 0:
            losses["prox"] = proximal_term(self.global_params, tc.prox_mu)
            total = total + losses["prox"]
        losses["total"] = total
        return losses

    def _train_step(self, losses: dict[str, torch.Tensor]) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        losses["total"].backward()
        norm = torch.nn.utils.clip_grad_norm_(self.student.parameters(), self.tc.clip)
        self.optimizer.step()
        return float(norm)

    def train_step(self, data: DemoDataset | DeviceDataset, idx: np.ndarray) -> dict[str, float]:
        """One optimiser step on the windows ending at frames ``idx``; returns loss values."""
        batch = self.process_batch(data, idx)
        out_s, out_t = self.forward(batch)
        losses = self._compute_losses(batch, out_s, out_t)
        grad_norm = self._train_step(losses)
        values = {k: float(v.detach()) for k, v in losses.items()}
        values["grad_norm"] = grad_norm
        return values

    def run(
        self,
        data: DemoDataset | DeviceDataset,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> dict[str, float]:
        """Optimise for ``epochs`` (or ``max_steps``); returns mean loss values and timing.

        ``on_start(total_steps)`` runs once before the first step (a robot's heartbeats say how
        many steps it expects), ``on_step(step, losses)`` after each.
        """
        tc = self.tc
        rng = np.random.default_rng(tc.seed)
        on_device = tc.data_on_device == "on" or (
            tc.data_on_device == "auto" and self.device.type == "cuda"
        )
        if on_device and not isinstance(data, DeviceDataset):
            data = DeviceDataset(data, self.device)  # batches built on the device
        steps_per_epoch = math.ceil(len(data) / tc.batch_size)
        total_steps = steps_per_epoch * tc.epochs
        if tc.max_steps is not None:
            total_steps = min(total_steps, tc.max_steps)
        if on_start is not None:
            on_start(total_steps)
        sums: dict[str, float] = {}
        step = 0
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_factor(
                tc.lr_schedule, s, total_steps, tc.lr_warmup_steps, tc.lr_final_ratio
            ),
        )
        t0 = time.perf_counter()
        bar = tqdm(total=total_steps, disable=not tc.progress, desc="local training", leave=False)
        try:
            while step < total_steps:
                order = rng.permutation(len(data))
                for start in range(0, len(order), tc.batch_size):
                    if step >= total_steps:
                        break
                    values = self.train_step(data, order[start : start + tc.batch_size])
                    scheduler.step()
                    if not math.isfinite(values["total"]):
                        raise FloatingPointError(f"non-finite loss at step {step}: {values}")
                    for k, v in values.items():
                        sums[k] = sums.get(k, 0.0) + v
                    step += 1
                    if on_step is not None:
                        on_step(step, values)
                    bar.update(1)
                    bar.set_postfix(bc=f"{values['bc']:.3f}")
        finally:
            bar.close()
        seconds = time.perf_counter() - t0
        metrics = {f"loss_{k}": v / max(step, 1) for k, v in sums.items()}
        metrics.update(
            steps=float(step), seconds=seconds, steps_per_s=step / seconds if seconds > 0 else 0.0
        )
        return metrics


@torch.no_grad()
def evaluate_nll(
    model: GMMPolicy,
    data: DemoDataset,
    batch_size: int = 64,
    device: torch.device | str | None = None,
) -> float:
    """Mean validation NLL of ``model`` over every window of ``data`` (eval mode)."""
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    try:
        for start in range(0, len(data), batch_size):
            idx = np.arange(start, min(start + batch_size, len(data)))
            batch = data.torch_batch(idx, dev)
            out = model.compute(batch)
            w = batch["valid"].float().sum().item()
            total += float(bc_nll(out.gmm.float(), batch["actions"], batch["valid"])) * w
            count += w
    finally:
        model.train(was_training)
    return total / max(count, 1.0)


def train_local(
    start: StateDict,
    episodes: Sequence[Episode],
    policy_cfg: PolicyConfig,
    trainer_cfg: TrainerConfig | None = None,
    val_episodes: Sequence[Episode] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> LocalResult:
    """Train the student from ``start`` on local episodes; returns params, samples, metrics.

    Metrics: ``loss_bc``, ``loss_sub_<modality>``, ``loss_act``, ``loss_prox``,
    ``loss_total`` (means over steps), ``val_nll`` (held-out episodes, when any), ``steps``,
    ``seconds``, ``steps_per_s``.
    """
    tc = trainer_cfg or TrainerConfig()
    if val_episodes is None:
        train_eps, val_eps = _split_val(episodes, tc)
    else:
        train_eps, val_eps = [e for e in episodes if e.success], list(val_episodes)
    data = DemoDataset(train_eps, policy_cfg)
    trainer = LocalTrainer(start, policy_cfg, tc)
    metrics = trainer.run(data, on_step, on_start)
    if val_eps and any(e.success for e in val_eps):
        metrics["val_nll"] = evaluate_nll(
            trainer.student, DemoDataset(val_eps, policy_cfg), device=trainer.device
        )
    return LocalResult(
        params=policy_to_state_dict(trainer.student), num_samples=len(data), metrics=metrics
    )


def normalization_stats(episodes: Sequence[Episode]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Low-dim (mean, std) of episodes, each std floored at a tenth of the key's physical scale.

    The floor matters: a dimension that is (nearly) constant in these demos (a padded object
    slot, a fixed orientation) must not amplify the small deviations other robots or tasks
    will show by 1000x.
    """
    from fed_ros.learning.dataset import compute_stats
    from fed_ros.learning.modeling_policy import LOWDIM_SPECS

    stats, _ = compute_stats(episodes)
    return {
        k: (m, np.maximum(s, 0.1 * LOWDIM_SPECS[k][2]).astype(np.float32))
        for k, (m, s) in stats.items()
    }


def with_normalization(sd: StateDict, episodes: Sequence[Episode]) -> StateDict:
    """A copy of ``sd`` whose ``normalizer.*`` buffers hold :func:`normalization_stats`."""
    out = dict(sd)
    for key, (mean, std) in normalization_stats(episodes).items():
        for suffix, value in (("mean", mean), ("std", std)):
            name = f"normalizer.{key}_{suffix}"
            if name not in out:
                raise ValueError(f"state dict has no normalisation buffer {name!r}")
            out[name] = np.asarray(value, np.float32).reshape(np.shape(out[name]))
    return out


def initial_state_dict(
    policy_cfg: PolicyConfig, seed: int = 0, episodes: Sequence[Episode] | None = None
) -> StateDict:
    """The fleet's common initial model theta^0; with episodes, normalisation from their stats."""
    from fed_ros.learning.modeling_policy import set_normalization

    model = build_policy(policy_cfg, seed=seed)
    if episodes:
        set_normalization(model, normalization_stats(episodes))
    return policy_to_state_dict(model)

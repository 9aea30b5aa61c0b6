"""The robot's side of a round, without ROS (Flower's ``NumPyClient`` shape).

One function or method per robot-side step, each written only here:

- `choose_start` (`RobotClient.choose_start`): TRAIN's first step, the cluster a robot trains
  for and the model it starts from, given its membership and the cluster models (IFCA's
  `pick_cluster` when the round config says so);
- `RobotClient.fit`: train the start model on the robot's episodes obeying only the
  strategy's `RoundConfig`;
- `RobotClient.fit_encoder`: one round of the fleet's shared visual encoder on every frame
  the robot recorded (`fleet_encoder`);
- `RobotClient.stage_descriptor` (`describe` / `score`): what a DESCRIBE or SCORE stage asks for;
- `evaluate_policy` (`RobotClient.evaluate`): a model run through a rollout callable (the arm
  over ROS, or MuJoCo in-process).

The robot node (`fed_ros.ros.nodes.robot.rounds`) and the benchmark
(`fed_ros.bench.federation.run`, `federation.partition`, `federation.evaluation`) both call these,
so benchmark numbers are fleet numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fed_ros.core.data.episode import Episode
from fed_ros.core.rounds.config import Membership, RoundConfig
from fed_ros.core.rounds.collect import DESCRIBE, SCORE
from fed_ros.core.strategies.types import ClientDescriptor
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
from fed_ros.learning.configuration_policy import PolicyConfig
from fed_ros.learning.configuration_trainer import TrainerConfig
from fed_ros.learning.trainer import LocalResult

log = logging.getLogger("fed_ros.learning.client")

StateDict = dict[str, np.ndarray]
FitResult = LocalResult  # (params, num_samples, metrics)

# TrainerConfig fields the round config or the client decides; a robot cannot override them.
_DECIDED_FIELDS = frozenset(
    {
        "prox_mu",
        "use_sub",
        "use_act",
        "lambda_sub",
        "lambda_act",
        "epochs",
        "seed",
        "device",
        "progress",
    }
)


def trainer_seed(robot_seed: int, round_idx: int) -> int:
    """The local trainer's seed of one robot in one round (the only place it is derived)."""
    return int(robot_seed) * 1000 + int(round_idx)


# --------------------------------------------------------------------------- TRAIN: where to start


@dataclass(frozen=True)
class StartChoice:
    """Where a robot's TRAIN starts: the cluster its update is for and the model it trains from."""

    cluster_id: int
    model: StateDict
    picked: bool  # the robot evaluated every listed cluster's model to choose (IFCA)


def no_cluster_error(membership: Membership) -> ValueError:
    """The error of a membership that names no cluster to start from (the aggregation's own
    wording)."""
    return ValueError(f"membership {list(membership)} has no cluster with weight > 0")


def primary_cluster(membership: Membership) -> int:
    """The cluster of largest weight (the first listed on ties): the cluster an update is for."""
    if not membership:
        raise no_cluster_error(membership)
    return int(max(membership, key=lambda m: m[1])[0])


def choose_start(
    membership: Membership,
    model_of: Callable[[Membership], StateDict],
    config: RoundConfig,
    pick: Callable[[Mapping[int, StateDict]], int],
) -> StartChoice:
    """The cluster a robot trains for and its start model, from its membership and the cluster
    models.

    ``model_of(membership)`` is the weighted mean of the listed cluster models (the robot node
    waits there for models still on their way; the benchmark averages the strategy's). With
    ``config.pick_cluster`` and several listed clusters, ``pick(candidates)`` chooses one of
    them (IFCA) and the robot starts from it alone; otherwise it starts from the weighted mean
    and its update is for the cluster of largest weight.

    An empty membership raises ValueError, in the fleet as in the benchmark. No strategy sends
    one (`RobotInstruction` refuses it, and so does the announcement's conversion on the robot),
    no strategy has a cluster -1 (IFCA's aggregation rejects it), and the robot node's former
    ``-1`` never left the robot: averaging no cluster model raised this very error right after.
    So the fleet behaves as before: the robot's TRAIN job fails with this error, logged, no update.
    """
    if not membership:
        raise no_cluster_error(membership)
    if config.pick_cluster and len(membership) > 1:
        candidates = {c: model_of([(c, 1.0)]) for c, _ in membership}
        cluster_id = pick(candidates)
        return StartChoice(cluster_id, candidates[cluster_id], picked=True)
    cluster_id = primary_cluster(membership)
    return StartChoice(cluster_id, model_of(membership), picked=False)


# --------------------------------------------------------------------------- EVALUATE


def evaluate_policy(
    model: StateDict,
    policy_cfg: PolicyConfig,
    rollout: Callable[[Any], Any],
    device: str,
    **runner_kw: Any,
) -> Any:
    """``rollout(runner)`` of ``model`` acting as a `PolicyRunner` (success rates, or a sim
    result)."""
    from fed_ros.learning.runner import PolicyRunner

    return rollout(PolicyRunner(model, policy_cfg, device=device, **runner_kw))


class RobotClient:
    """One robot's learning: start choice, fit, describe, score, IFCA pick, evaluate (no ROS, no
    simulator).

    ``local`` holds the robot's own TrainerConfig settings (``lr``, ``batch_size``,
    ``max_steps``, ``val_fraction``, ...); the round config overrides ``lr`` when it sets
    one, ``local_steps`` replaces ``max_steps``, and the fields it always decides
    (mu, distillation, epochs) cannot be set locally. ``seed_schedule(round_idx)`` replaces
    `trainer_seed` (only the partition study uses it, to keep its published seeds).
    """

    def __init__(
        self,
        robot_id: str,
        policy_cfg: PolicyConfig,
        robot_seed: int = 0,
        device: str = "auto",
        local: Mapping[str, Any] | None = None,
        seed_schedule: Callable[[int], int] | None = None,
    ) -> None:
        from fed_ros.learning.trainer import initial_state_dict

        self.robot_id = robot_id
        self.policy_cfg = policy_cfg
        self.robot_seed = int(robot_seed)
        self.seed_schedule = seed_schedule
        self.device = device
        self.local = dict(local or {})
        decided = sorted(set(self.local) & _DECIDED_FIELDS)
        if decided:
            raise ValueError(
                f"robot {robot_id!r}: local trainer setting(s) {decided} are decided by the "
                "strategy's round config (set them as strategy settings in the fleet file)"
            )
        TrainerConfig(**self.local, device=device)  # fail at start on a bad local setting
        # Placeholder normalisation of the fleet's initial model (what round 0 replaces).
        self._placeholder = {
            k: v for k, v in initial_state_dict(policy_cfg).items() if k.startswith("normalizer.")
        }
        self.rnd_fit: Any = None  # RNDFit of the last DESCRIBE (rnd), used by `score`

    # ------------------------------------------------------------------ training
    def choose_start(
        self,
        membership: Membership,
        model_of: Callable[[Membership], StateDict],
        config: RoundConfig,
        episodes: Sequence[Episode],
    ) -> StartChoice:
        """`choose_start` with this robot's IFCA pick (`pick_cluster` on its episodes)."""
        return choose_start(
            membership, model_of, config, lambda candidates: self.pick_cluster(candidates, episodes)
        )

    def trainer_config(self, config: RoundConfig, round_idx: int) -> TrainerConfig:
        """Local settings overlaid with everything the round config decides."""
        seed = (
            self.seed_schedule(round_idx)
            if self.seed_schedule is not None
            else trainer_seed(self.robot_seed, round_idx)
        )
        kw: dict[str, Any] = dict(self.local)
        kw.update(
            prox_mu=config.prox_mu,
            use_sub=config.use_sub,
            use_act=config.use_act,
            lambda_sub=config.lambda_sub,
            lambda_act=config.lambda_act,
            epochs=config.local_epochs,
            device=self.device,
            progress=False,
            seed=seed,
        )
        if config.local_steps is not None:
            # Exactly local_steps steps: every epoch has >= 1 step, so this many epochs suffice.
            kw.update(epochs=config.local_steps, max_steps=config.local_steps)
        if config.lr is not None:
            kw["lr"] = config.lr
        return TrainerConfig(**kw)

    def with_local_normalization(self, model: StateDict, episodes: Sequence[Episode]) -> StateDict:
        """Fill the input normalisation from local data when the model carries none yet.

        The server has no data, so the fleet's initial model holds placeholder statistics;
        each robot writes its own (mean, std) in its first round and the buffers are then
        averaged within clusters like every other tensor. Measured in-process on lift
        (15 demos, 800 steps): 0/4 successes without data statistics, 3/4 with them.
        The stds are floored at a tenth of each key's physical scale (the learning module's
        `with_normalization`, the same rule as a fleet-made initial model): a flat 1e-3
        floor turned tiny deviations of constant or zero-padded inputs into 1000x inputs.
        """
        # Compared to 0.1 %, not bit for bit: a fleet sending float16 cluster models delivers
        # 0.02 as 0.019997 (int8 encodings reproduce these constant tensors exactly), and a
        # robot that missed the placeholder never set its normalisation and learned nothing
        # (measured: FedDRMan 0.0-0.08 success with float16 models against 0.33-0.75).
        if not self._placeholder or any(
            k not in model
            or np.shape(model[k]) != v.shape
            or not np.allclose(model[k], v, rtol=1e-3, atol=0.0)
            for k, v in self._placeholder.items()
        ):
            return model
        from fed_ros.learning.trainer import with_normalization

        log.info("%s: input normalisation set from local demonstrations", self.robot_id)
        return with_normalization(model, [e for e in episodes if e.success])

    def fit(
        self,
        start_model: StateDict,
        config: RoundConfig,
        episodes: Sequence[Episode],
        round_idx: int,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        on_start: Callable[[int], None] | None = None,
    ) -> FitResult:
        """Train ``start_model`` on the local episodes as ``config`` says: (params, samples,
        metrics).

        ``on_step(step, losses)`` runs between optimiser steps (progress; an exception it raises,
        e.g. on shutdown, ends training there); ``on_start(total_steps)`` once before them.
        """
        from fed_ros.learning.trainer import train_local

        if not any(e.success for e in episodes):
            raise RuntimeError(f"{self.robot_id}: no successful demonstrations to train on")
        start = self.with_local_normalization(start_model, episodes)
        return train_local(
            start,
            episodes,
            self.policy_cfg,
            self.trainer_config(config, round_idx),
            on_step=on_step,
            on_start=on_start,
        )

    def fit_encoder(
        self,
        encoder: StateDict,
        encoder_cfg: FleetEncoderConfig,
        episodes: Sequence[Episode],
        round_idx: int,
    ) -> FitResult:
        """Train the fleet's shared visual encoder on every local episode (demonstrations,
        rollouts, interventions: failures too) for one encoder round: (params, frames, metrics).

        ``encoder_cfg`` is the fleet's, the same on every robot; the same seed rule as `fit`.
        """
        from fed_ros.learning.fleet_encoder import train_encoder

        if not episodes:
            raise RuntimeError(f"{self.robot_id}: no recorded episodes to train the encoder on")
        seed = (
            self.seed_schedule(round_idx)
            if self.seed_schedule is not None
            else trainer_seed(self.robot_seed, round_idx)
        )
        return train_encoder(encoder, episodes, encoder_cfg, seed)

    def pick_cluster(
        self, candidate_models: Mapping[int, StateDict], episodes: Sequence[Episode]
    ) -> int:
        """IFCA: id of the cluster whose model has the lowest NLL on local data (as it would be
        trained)."""
        from fed_ros.core.strategies.ifca import ifca_select
        from fed_ros.learning.dataset import DemoDataset
        from fed_ros.learning.modeling_policy import build_policy
        from fed_ros.learning.trainer import evaluate_nll
        from fed_ros.learning.weights import load_state_dict_into

        data = DemoDataset([e for e in episodes if e.success], self.policy_cfg)
        cids = sorted(candidate_models)
        losses = [
            evaluate_nll(
                load_state_dict_into(
                    build_policy(self.policy_cfg, seed=0),
                    self.with_local_normalization(candidate_models[c], episodes),
                ),
                data,
            )
            for c in cids
        ]
        return int(cids[ifca_select(losses)])

    # ------------------------------------------------------------------ descriptors
    def stage_descriptor(
        self,
        stage: str,
        config: RoundConfig,
        episodes: Sequence[Episode],
        peer_predictors: Mapping[str, bytes] | None = None,
    ) -> ClientDescriptor:
        """This robot's answer to a DESCRIBE stage (the round config's kind) or a SCORE stage (RND
        phase two: the peers' predictors scored on local data; its own, if listed, is never
        scored)."""
        if stage == DESCRIBE:
            return self.describe(config.descriptor_kind, episodes)
        if stage == SCORE:
            return self.score(peer_predictors or {}, episodes)
        raise ValueError(f"{self.robot_id}: stage {stage!r} asks for no descriptor")

    def describe(self, kind: str, episodes: Sequence[Episode]) -> ClientDescriptor:
        """The descriptor a DESCRIBE stage asks for (``kind`` from the round config)."""
        n = sum(len(e) for e in episodes)
        if kind == "rnd":
            from fed_ros.learning.rnd_descriptor import fit_rnd

            # Predictor on all local episodes; s_ii and sigma_i on held-out ones (cross-validated).
            self.rnd_fit = fit_rnd(episodes, seed=self.robot_seed)
            return ClientDescriptor(
                robot_id=self.robot_id,
                kind="rnd",
                num_samples=n,
                payload=self.rnd_fit.predictor,
                residual_std=self.rnd_fit.residual_std,
            )
        if kind == "gaussian":
            from fed_ros.learning.descriptors import gaussian_descriptor

            mean, var = gaussian_descriptor(episodes, policy_cfg=self.policy_cfg)
            return ClientDescriptor(
                robot_id=self.robot_id,
                kind="gaussian",
                mean=np.asarray(mean),
                variance=np.asarray(var),
                num_samples=n,
            )
        raise ValueError(f"{self.robot_id}: cannot compute descriptor kind {kind!r}")

    def score(
        self, peer_predictors: Mapping[str, bytes], episodes: Sequence[Episode]
    ) -> ClientDescriptor:
        """RND phase two: novelty of every peer's predictor on local data, plus the held-out own
        one."""
        from fed_ros.learning.rnd_descriptor import rnd_novelty

        if self.rnd_fit is None:
            raise RuntimeError(
                f"{self.robot_id}: SCORE without a predictor of this robot (DESCRIBE missed)"
            )
        scores = {
            r: rnd_novelty(blob, episodes)
            for r, blob in peer_predictors.items()
            if r != self.robot_id
        }
        scores[self.robot_id] = (
            self.rnd_fit.self_novelty
        )  # held out, comparable with the peers' s_ij
        return ClientDescriptor(
            robot_id=self.robot_id,
            kind="rnd",
            num_samples=sum(len(e) for e in episodes),
            scores=scores,
            residual_std=self.rnd_fit.residual_std,
        )

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self, model: StateDict, rollout: Callable[[Any], dict[str, float]], **runner_kw: Any
    ) -> dict[str, float]:
        """Success rate per task of ``model``: ``rollout(policy_runner)`` drives the arm."""
        device = runner_kw.pop("device", self.device)
        return evaluate_policy(model, self.policy_cfg, rollout, device, **runner_kw)

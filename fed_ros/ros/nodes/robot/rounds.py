"""The stage work of a robot node: what each announced stage asks of the robot.

TRAIN: choose the start model and fit it under the round config (`RobotClient`) and offer the
update (`UpdateUplink`); DESCRIBE / SCORE: publish the descriptor the stage asks for; EVALUATE:
drive the arm with the cluster model and report success rates. Runs on the node's worker thread.
The learning steps are the ROS-free client's (`fed_ros.learning.client`), the very calls the
benchmark makes; this module adds only what ROS needs: waiting for models and peers, publishing,
signing, the arm. Every collaborator is handed over explicitly (no node).
"""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.core.rounds.config import Membership, RoundConfig
from fed_ros.core.rounds.collect import DESCRIBE, EVALUATE, SCORE, TRAIN
from fed_ros.msg import ClientDescriptor as DescriptorMsg, RobotMetrics, TrainingProgress
from fed_ros.ros import shutdown
from fed_ros.ros.nodes.robot.heartbeat import TrainingHeartbeat
from fed_ros.ros.shutdown import ShutdownRequested
from fed_ros.ros.wire.round_msgs import Announcement, descriptor_to_msg
from fed_ros.core.progress import progress_text
from fed_ros.core.encodings.feedback import starts_from_one_cluster
from fed_ros.learning.tracking import open_tracker_or_warn
from fed_ros.ros.nodes.robot.update_encoding import UpdateEncoder
from fed_ros.ros.wire.tensors import encode_state_dict
from fed_ros.core.arm.interventions import InterventionTally

PEER_WAIT_S = 30.0  # how long SCORE waits for the other participants' predictors
ARM_WAIT_S = (
    600.0  # how long an evaluation waits for the arm (another evaluation or demonstration run)
)


@dataclass(frozen=True)
class RoundsCollaborators:
    """What a robot's stage work needs, handed over explicitly (no node)."""

    client: Any  # learns (`RobotClient`: robot id, policy, fit, descriptors)
    models: Any  # the received cluster models (`ModelCache`)
    uplink: Any  # sends updates (`UpdateUplink`)
    demos: Any  # the demonstrations (`RobotDemonstrations`: episodes, status)
    arm: Any  # driven under ``arm_lock`` to evaluate (None: no arm)
    arm_lock: threading.Lock
    params: Callable[[], Any]  # the robot's current parameters (live)
    log: Any  # the node's logger
    stop: threading.Event  # the node's stop flag
    latest: Callable[[], Announcement | None]  # the newest announcement received
    signer: Any  # signs descriptors (None: unsigned)
    model_dir: Path  # keeps local updates
    log_transfer: Callable[..., None]  # log_transfer(**entry) writes the transfer log
    descriptor_pub: Any  # the fleet's descriptor topic ...
    metrics_pub: Any  # ... and metrics topic, published once wait_matched(pub, what) returns
    wait_matched: Callable[[Any, str], None]
    progress_pub: Any = None  # the training heartbeats (None: none are sent)


class RobotRounds:
    """One robot's answer to each round stage (worker thread), over its
    :class:`RoundsCollaborators`."""

    def __init__(self, deps: RoundsCollaborators) -> None:
        self.client, self.models, self.uplink, self.demos = (
            deps.client,
            deps.models,
            deps.uplink,
            deps.demos,
        )
        self.arm, self.arm_lock, self.params = deps.arm, deps.arm_lock, deps.params
        self.log, self.stop, self.latest = deps.log, deps.stop, deps.latest
        self.signer, self.model_dir, self.log_transfer = (
            deps.signer,
            deps.model_dir,
            deps.log_transfer,
        )
        self.descriptor_pub, self.metrics_pub, self.wait_matched = (
            deps.descriptor_pub,
            deps.metrics_pub,
            deps.wait_matched,
        )
        client, log, params, signer = deps.client, deps.log, deps.params, deps.signer
        model_dir, progress_pub = deps.model_dir, deps.progress_pub
        self.robot_id: str = client.robot_id
        self.heartbeat = TrainingHeartbeat(
            self.robot_id,
            progress_pub.publish if progress_pub is not None else lambda msg: None,
            TrainingProgress,
            signer,
            lambda: params().heartbeat_period_s if progress_pub is not None else 0.0,
        )
        self.encoder = UpdateEncoder(model_dir, log)  # update_encoding, topk's residual
        p = params()  # losses per step and evaluations, in the run's tb tree (data_dir/..)
        self.tracker = open_tracker_or_warn(
            p.tracking,
            p.tracking_dir or Path(model_dir).parent.parent / "tb" / client.robot_id,
            client.robot_id,
            log.warning,
        )
        self.steps_tracked = 0  # optimiser steps of earlier rounds (the tracker's step axis)
        self.peer_predictors: dict[tuple[int, str], bytes] = {}  # RND: (round, robot) -> predictor
        # Steps and seconds of the last fit (diagnostics).
        self.last_train: tuple[int, float] = (0, 0.0)
        # The last evaluation's human takeovers, and the segments recorded as demonstrations.
        self.last_interventions = InterventionTally()
        self.segments_recorded = 0

    def on_peer_descriptor(self, msg) -> None:
        """Keep the peers' RND predictors (the SCORE stage scores them on local data)."""
        keep_peer_predictor(self.peer_predictors, msg, self.latest(), self.robot_id)

    def run_stage(self, ann: Announcement) -> None:
        """Obey the round config the announcement carries for this robot, for its stage."""
        membership = ann.memberships.get(self.robot_id, [])
        config = ann.configs.get(self.robot_id, RoundConfig())  # validated on receipt; obeyed as is
        waiting = self.demos.status() if ann.stage in (TRAIN, DESCRIBE, SCORE) else ""
        if waiting:
            # Expected on a new arm: no error, the server is told why this robot sits the stage out.
            self.log.info(
                f"round {ann.round_idx} {ann.stage}: {waiting}; not taking part",
                throttle_duration_sec=30.0,
            )
            self.decline(ann, membership, waiting)
            return
        self.log.info(f"round {ann.round_idx} {ann.stage}: obeying {config}")
        if ann.stage == TRAIN:
            self.train(ann, membership, config)
        elif ann.stage == DESCRIBE:
            self.publish_descriptor(
                self.client.stage_descriptor(DESCRIBE, config, self.demos.episodes()), ann.round_idx
            )
        elif ann.stage == SCORE:
            self.score(ann, config)
        elif ann.stage == EVALUATE:
            self.evaluate_round(ann, membership, config)

    # ------------------------------------------------------------------ TRAIN
    def train(self, ann: Announcement, membership: Membership, config: RoundConfig) -> None:
        cached = self.uplink.cached(ann.round_idx)
        if cached is not None:
            # Re-announced (server restarted or the round was retried): the cached update goes
            # again under a fresh nonce and id (the round's earlier nonce may be spent); no
            # retraining.
            self.uplink.offer(cached.item, ann, dict(cached.item.meta))
            self.log.info(f"round {ann.round_idx}: re-sent the update already trained")
            return
        from fed_ros.learning.weights import save_checkpoint

        episodes = self.demos.episodes()
        # Waits here for the round's cluster model(s) still on their way.
        start = self.client.choose_start(
            membership, lambda m: self.models.for_round(ann.round_idx, m), config, episodes
        )
        t0 = time.monotonic()
        result = self.client.fit(
            start.model,
            config,
            episodes,
            ann.round_idx,
            on_step=self._on_train_step(ann.round_idx),
            on_start=lambda total: self.heartbeat.start(ann.round_idx, total),
        )
        metrics = result.metrics
        self.steps_tracked += int(metrics.get("steps", 0))
        self.tracker.flush()
        self.last_train = (
            int(metrics.get("steps", 0)),
            time.monotonic() - t0,
        )  # diagnostics: throughput
        save_checkpoint(
            self.model_dir / f"local_round_{ann.round_idx:04d}.safetensors",
            result.params,
            self.client.policy_cfg,
        )
        fields = dict(
            cluster_id=start.cluster_id,
            num_samples=result.num_samples,
            train_loss=float(metrics.get("loss_bc", metrics.get("loss_total", math.nan))),
            val_loss=float(metrics.get("val_nll", math.nan)),
        )
        encoded = self.encoder.encode(
            result.params,
            start.model,
            starts_from_one_cluster(membership, start.picked),
            self.params(),
        )
        # Re-sent until acknowledged for as long as the server's heartbeat extension typically
        # lasts (4 periods by default: fed_ros.core.rounds.liveness), when heartbeats are on.
        out = self.uplink.offer(encoded, ann, fields, grace_s=4.0 * self.heartbeat.period_s())
        self.log.info(
            f"round {ann.round_idx}: trained {int(metrics.get('steps', 0))} steps in "
            f"{time.monotonic() - t0:.1f} s (bc {fields['train_loss']:.3f}), sent update "
            f"{out.encoded.total_bytes} B {out.encoded.sha256[:12]}"
        )

    def decline(self, ann: Announcement, membership: Membership, reason: str) -> None:
        """Tell the server this robot will not answer the stage, and why (RobotMetrics, accepted
        false)."""
        msg = RobotMetrics(
            robot_id=self.robot_id,
            cluster_ids=[int(c) for c, w in membership if w > 0],
            num_samples=0,
            train_loss=math.nan,
            val_loss=math.nan,
            success_rate=math.nan,
            accepted=False,
            reason=reason,
        )
        self.publish_metrics(msg)

    def _on_train_step(self, round_idx: int) -> Callable[[int, dict[str, float]], None]:
        """Called between optimiser steps: stops training on shutdown, sends the heartbeat, logs
        progress every ~10 s."""
        last = [time.monotonic()] * 2  # last log, start
        base = self.steps_tracked

        def on_step(step: int, values: dict[str, float]) -> None:
            shutdown.check(self.stop)
            delay = self.params().train_step_delay_s  # a slower computer, emulated (SIL tests)
            if delay > 0:
                shutdown.sleep(delay, self.stop)
            self.heartbeat.step(step)
            self.tracker.scalars({f"train/{k}": v for k, v in values.items()}, base + step)
            if time.monotonic() - last[0] >= 10.0:
                last[0] = time.monotonic()
                done = progress_text(step, self.heartbeat.expected_steps, last[0] - last[1])
                self.log.info(
                    f"round {round_idx}: training, {done} (bc {values.get('bc', math.nan):.3f})"
                )

        return on_step

    # ------------------------------------------------------------------ DESCRIBE / SCORE
    def score(self, ann: Announcement, config: RoundConfig) -> None:
        """RND phase two: wait (bounded) for the peers' predictors, then score them on local
        data."""
        deadline = time.monotonic() + PEER_WAIT_S
        peers = [r for r in ann.participants if r != self.robot_id]
        have = self.peer_predictors
        while any((ann.round_idx, r) not in have for r in peers) and time.monotonic() < deadline:
            shutdown.sleep(0.1, self.stop)
        predictors = {r: have[(ann.round_idx, r)] for r in peers if (ann.round_idx, r) in have}
        self.publish_descriptor(
            self.client.stage_descriptor(SCORE, config, self.demos.episodes(), predictors),
            ann.round_idx,
        )

    def publish_descriptor(self, desc, round_idx: int) -> None:
        nonce = secrets.token_bytes(16)
        signature = b""
        if self.signer is not None:
            from fed_ros.core.checks.descriptor_checks import digest_of_descriptor

            signature = self.signer.sign_descriptor(
                round_idx, self.robot_id, nonce, digest_of_descriptor(desc)
            )
        msg = descriptor_to_msg(desc, round_idx, nonce=nonce, signature=signature)
        self.wait_matched(self.descriptor_pub, "the fleet's descriptors topic")
        self.descriptor_pub.publish(msg)
        self.log.info(f"round {round_idx}: sent {desc.kind} descriptor")

    def publish_metrics(self, msg) -> None:
        self.wait_matched(self.metrics_pub, "the fleet's robot_metrics topic")
        self.metrics_pub.publish(msg)

    # ------------------------------------------------------------------ EVALUATE
    def evaluate_model(
        self, model: dict[str, np.ndarray], episodes: int, seed: int
    ) -> dict[str, float]:
        """Closed-loop success rate per task, driving this robot's arm over ROS (one driver at a
        time)."""
        from fed_ros.ros.arm.driving import InputTally, run_policy
        from fed_ros.ros.arm.interventions import InterventionRecorder

        p = self.params()
        deadline = time.monotonic() + ARM_WAIT_S
        while not self.arm_lock.acquire(timeout=shutdown.POLL_S):
            shutdown.check(self.stop)
            if time.monotonic() > deadline:
                raise TimeoutError("the arm is busy (another evaluation or demonstration run)")
        try:
            # Commands name the model that produced them (its wire sha256, as in the cluster model).
            source = f"policy:{encode_state_dict(model).sha256[:12]}"
            tallies: list[InputTally] = []
            # A human may take over (the deadman of a teleop device): each segment becomes a
            # corrective demonstration, and the takeovers are counted (human-gated DAgger).
            human = InterventionRecorder(self.demos.recorder, p.variation, self.log)
            interventions = InterventionTally()

            def rollout(runner):
                tallies.append(InputTally(runner))  # what the policy was fed (camera frames or not)
                return run_policy(
                    self.arm,
                    tallies[-1],
                    list(p.tasks),
                    p.variation,
                    episodes,
                    seed,
                    p.max_episode_steps,
                    source=source,
                    handover=human,
                    tally=interventions,
                )

            try:
                rates = self.client.evaluate(model, rollout)
            finally:
                human.wait()  # the last segment saved before it is counted and trained on
                self.last_interventions = interventions
                self.segments_recorded += human.recorded
            self.log_transfer(
                kind="rollout_inputs", source=source, episodes=episodes, **tallies[-1].summary()
            )
            return rates
        finally:
            self.arm_lock.release()

    def evaluate_round(
        self, ann: Announcement, membership: Membership, config: RoundConfig
    ) -> None:
        model = self.models.for_round(ann.round_idx, membership)
        t0 = time.monotonic()
        episodes = (
            config.eval_episodes or self.params().eval_episodes
        )  # the server's request, else our own
        rates = self.evaluate_model(model, episodes, seed=self.params().seed)
        mean = float(np.mean(list(rates.values())))
        msg = RobotMetrics(
            robot_id=self.robot_id,
            cluster_ids=[int(c) for c, w in membership if w > 0],
            num_samples=0,
            train_loss=math.nan,
            val_loss=math.nan,
            success_rate=mean,
            interventions_per_episode=self.last_interventions.per_episode,
            human_seconds_per_episode=self.last_interventions.human_seconds_per_episode,
            accepted=True,
            reason=json.dumps(rates),
        )
        self.publish_metrics(msg)
        self.tracker.scalars(
            {"eval/success_mean": mean, **{f"eval/success/{t}": r for t, r in rates.items()}},
            ann.round_idx,
        )
        self.tracker.flush()
        self.log_transfer(
            kind="evaluation",
            round=ann.round_idx,
            success=rates,
            interventions=self.last_interventions.summary(),
        )
        self.log.info(f"round {ann.round_idx}: evaluated {rates} in {time.monotonic() - t0:.1f} s")

    def answer_evaluate(self, request, response):
        """The EvaluatePolicy service: the robot's newest model, driven on its arm."""
        try:
            model, _ = self.models.newest_for(self.robot_id)
            episodes = int(request.episodes) or self.params().eval_episodes
            segments = self.segments_recorded
            rates = self.evaluate_model(model, episodes, int(request.seed))
            # The intervention rate of this evaluation goes back to whoever asked (`fed-ros robot
            # evaluate` prints it): RobotMetrics is the line of a round's report, and an
            # evaluation between rounds belongs to none.
            human = self.last_interventions
            response.ok, response.message = (
                True,
                (
                    f"{episodes} episode(s) per task; {human.per_episode:.2f} interventions and "
                    f"{human.human_seconds_per_episode:.1f} s of human control per episode, "
                    f"{self.segments_recorded - segments} corrective segment(s) recorded"
                ),
            )
            response.tasks = list(rates)
            response.success_rates = [float(v) for v in rates.values()]
            response.mean_success_rate = float(np.mean(list(rates.values())))
        except (ValueError, RuntimeError, TimeoutError) as exc:
            response.ok, response.message = False, str(exc)
        except ShutdownRequested:
            response.ok, response.message = False, "the robot node is shutting down"
        return response


# The peers' RND predictors a robot keeps between the DESCRIBE and SCORE stages.
#
# In RND clustering each robot scores every other participant's predictor on its own data
# (the SCORE stage). Anyone on the DDS domain can publish a descriptor and only the server checks
# signatures, so what a robot keeps is bounded: RND predictors of participants of the current
# round (or of the next, which may arrive before its announcement), at most MAX_PREDICTOR_BYTES
# each and MAX_PEER_PREDICTORS in all; older rounds' are dropped as a new round begins.
MAX_PREDICTOR_BYTES = 16 << 20
MAX_PEER_PREDICTORS = 256


def keep_peer_predictor(
    store: dict[tuple[int, str], bytes], msg: Any, ann: Any, own_id: str
) -> None:
    """Add ``msg``'s predictor to ``store`` ((round, robot) -> bytes) if it is one to keep;
    ``ann`` is the newest announcement (None: none yet)."""
    rid, round_idx = str(msg.robot_id), int(msg.round)
    if (
        int(msg.kind) != DescriptorMsg.KIND_RND
        or not len(msg.payload)
        or len(msg.payload) > MAX_PREDICTOR_BYTES
        or len(rid) > 256
        or rid == own_id
    ):
        return
    if ann is not None:
        if not ann.round_idx <= round_idx <= ann.round_idx + 1:
            return
        if round_idx == ann.round_idx and rid not in ann.participants:
            return
        for key in [k for k in store if k[0] < ann.round_idx]:
            del store[key]
    if (round_idx, rid) not in store and len(store) >= MAX_PEER_PREDICTORS:
        return
    store[(round_idx, rid)] = bytes(msg.payload)

"""The stage work of a robot node: what each announced stage asks of the robot.

TRAIN: fit the round's starting model under the round config (RobotClient) and offer the
update (UpdateUplink); DESCRIBE / SCORE: publish a descriptor; EVALUATE: drive the arm with
the cluster model and report success rates. Runs on the node's worker thread; the robot node
(``node``) supplies the client, model cache, arm, publishers, parameters and logging.
"""
from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable

import numpy as np

from fed_ros.core.round_config import RoundConfig
from fed_ros.core.rounds import DESCRIBE, EVALUATE, SCORE, TRAIN
from fed_ros.msg import ClientDescriptor as DescriptorMsg, RobotMetrics
from fed_ros.ros import shutdown
from fed_ros.ros.shutdown import ShutdownRequested
from fed_ros.ros.wire.round_msgs import Announcement, descriptor_to_msg
from fed_ros.ros.wire.tensors import encode_state_dict
from fed_ros.ros.wire.publish import wait_for_subscribers

Membership = list[tuple[int, float]]
# Bounds on the peers' RND predictors a robot keeps for the SCORE stage.
MAX_PREDICTOR_BYTES = 16 << 20
MAX_PEER_PREDICTORS = 256


class RobotRounds:
    """One robot's answer to each round stage (worker thread)."""

    def __init__(self, node) -> None:
        self.node = node
        self.peer_predictors: dict[tuple[int, str], bytes] = {}  # RND: (round, robot) -> predictor

    def on_peer_descriptor(self, msg) -> None:
        """Keep the peers' RND predictors (the SCORE stage scores them on local data)."""
        # Capped (anyone on the domain can publish descriptors; only the server checks them): RND
        # predictors of participants of the current round (or of the next, which may arrive before
        # its announcement), at most MAX_PREDICTOR_BYTES each and MAX_PEER_PREDICTORS in all.
        ann = self.node.latest_announcement
        rid, round_idx = str(msg.robot_id), int(msg.round)
        if int(msg.kind) != DescriptorMsg.KIND_RND or not len(msg.payload) or len(msg.payload) > MAX_PREDICTOR_BYTES \
                or len(rid) > 256 or rid == self.node.robot_id:
            return
        if ann is not None:
            if not ann.round_idx <= round_idx <= ann.round_idx + 1:
                return
            if round_idx == ann.round_idx and rid not in ann.participants:
                return
            for key in [k for k in self.peer_predictors if k[0] < ann.round_idx]:
                del self.peer_predictors[key]
        if (round_idx, rid) not in self.peer_predictors and len(self.peer_predictors) >= MAX_PEER_PREDICTORS:
            return
        self.peer_predictors[(round_idx, rid)] = bytes(msg.payload)

    def run_stage(self, ann: Announcement) -> None:
        """Obey the round config the announcement carries for this robot, for its stage."""
        n = self.node
        membership = ann.memberships.get(n.robot_id, [])
        config = ann.configs.get(n.robot_id, RoundConfig())  # validated on receipt; obeyed as is
        waiting = n.demos.status() if ann.stage in (TRAIN, DESCRIBE, SCORE) else ""
        if waiting:
            # Expected on a new arm: no error, the server is told why this robot sits the stage out.
            n.get_logger().info(f"round {ann.round_idx} {ann.stage}: {waiting}; not taking part",
                                throttle_duration_sec=30.0)
            self.decline(ann, membership, waiting)
            return
        n.get_logger().info(f"round {ann.round_idx} {ann.stage}: obeying {config}")
        if ann.stage == TRAIN:
            self.train(ann, membership, config)
        elif ann.stage == DESCRIBE:
            self.publish_descriptor(n.client.describe(config.descriptor_kind, n.episodes()), ann.round_idx)
        elif ann.stage == SCORE:
            self.score(ann)
        elif ann.stage == EVALUATE:
            self.evaluate_round(ann, membership, config)

    # ------------------------------------------------------------------ TRAIN
    def train(self, ann: Announcement, membership: Membership, config: RoundConfig) -> None:
        n = self.node
        cached = n.uplink.cached(ann.round_idx)
        if cached is not None:
            # Re-announced (server restarted or the round was retried): the cached update goes
            # again under a fresh nonce and id (the round's earlier nonce may be spent); no retraining.
            n.uplink.offer(cached.item, ann, dict(cached.item.meta))
            n.get_logger().info(f"round {ann.round_idx}: re-sent the update already trained")
            return
        from fed_ros.learning.weights import save_checkpoint

        episodes = n.episodes()
        cluster_id = int(max(membership, key=lambda m: m[1])[0]) if membership else -1
        if config.pick_cluster and len(membership) > 1:
            candidates = {c: n.models.for_round(ann.round_idx, [(c, 1.0)]) for c, _ in membership}
            cluster_id = n.client.pick_cluster(candidates, episodes)
            start = candidates[cluster_id]
        else:
            start = n.models.for_round(ann.round_idx, membership)
        t0 = time.monotonic()
        result = n.client.fit(start, config, episodes, ann.round_idx, on_step=self._on_train_step(ann.round_idx))
        metrics = result.metrics
        self.last_train = (int(metrics.get("steps", 0)), time.monotonic() - t0)  # diagnostics: throughput
        save_checkpoint(n.model_dir / f"local_round_{ann.round_idx:04d}.safetensors", result.params, n.policy_cfg)
        fields = dict(cluster_id=cluster_id, num_samples=result.num_samples,
                      train_loss=float(metrics.get("loss_bc", metrics.get("loss_total", math.nan))),
                      val_loss=float(metrics.get("val_nll", math.nan)))
        out = n.uplink.offer(encode_state_dict(result.params), ann, fields)
        n.get_logger().info(
            f"round {ann.round_idx}: trained {int(metrics.get('steps', 0))} steps in {time.monotonic() - t0:.1f} s "
            f"(bc {fields['train_loss']:.3f}), sent update {out.encoded.total_bytes} B {out.encoded.sha256[:12]}")

    def decline(self, ann: Announcement, membership: Membership, reason: str) -> None:
        """Tell the server this robot will not answer the stage, and why (RobotMetrics, accepted false)."""
        n = self.node
        msg = RobotMetrics(robot_id=n.robot_id, cluster_ids=[int(c) for c, w in membership if w > 0],
                           num_samples=0, train_loss=math.nan, val_loss=math.nan, success_rate=math.nan,
                           accepted=False, reason=reason)
        wait_for_subscribers(n, n.metrics_pub, "the fleet's robot_metrics topic")
        n.metrics_pub.publish(msg)

    def _on_train_step(self, round_idx: int) -> Callable[[int, dict[str, float]], None]:
        """Called between optimiser steps: stops training on shutdown; logs progress every ~10 s."""
        last = [time.monotonic()]
        n = self.node

        def on_step(step: int, values: dict[str, float]) -> None:
            shutdown.check(n.stop_event)
            if time.monotonic() - last[0] >= 10.0:
                last[0] = time.monotonic()
                n.get_logger().info(f"round {round_idx}: training, step {step} (bc {values.get('bc', math.nan):.3f})")
        return on_step

    # ------------------------------------------------------------------ DESCRIBE / SCORE
    def score(self, ann: Announcement) -> None:
        """RND phase two: wait (bounded) for the peers' predictors, then score them on local data."""
        n = self.node
        deadline = time.monotonic() + 30.0
        peers = [r for r in ann.participants if r != n.robot_id]
        have = self.peer_predictors
        while any((ann.round_idx, r) not in have for r in peers) and time.monotonic() < deadline:
            shutdown.sleep(0.1, n.stop_event)
        predictors = {r: have[(ann.round_idx, r)] for r in peers if (ann.round_idx, r) in have}
        self.publish_descriptor(n.client.score(predictors, n.episodes()), ann.round_idx)

    def publish_descriptor(self, desc, round_idx: int) -> None:
        n = self.node
        nonce = secrets.token_bytes(16)
        signature = b""
        if n.signer is not None:
            from fed_ros.core.descriptor_checks import digest_of_descriptor
            signature = n.signer.sign_descriptor(round_idx, n.robot_id, nonce, digest_of_descriptor(desc))
        msg = descriptor_to_msg(desc, round_idx, nonce=nonce, signature=signature)
        wait_for_subscribers(n, n.descriptor_pub, "the fleet's descriptors topic")
        n.descriptor_pub.publish(msg)
        n.get_logger().info(f"round {round_idx}: sent {desc.kind} descriptor")

    # ------------------------------------------------------------------ EVALUATE
    def evaluate_model(self, model: dict[str, np.ndarray], episodes: int, seed: int) -> dict[str, float]:
        """Closed-loop success rate per task, driving this robot's arm over ROS (one driver at a time)."""
        from fed_ros.ros.arm.driving import InputTally, run_policy
        n = self.node
        p = n.params
        deadline = time.monotonic() + 600.0
        while not n.arm_lock.acquire(timeout=shutdown.POLL_S):
            shutdown.check(n.stop_event)
            if time.monotonic() > deadline:
                raise TimeoutError("the arm is busy (another evaluation or demonstration run)")
        try:
            # Commands name the model that produced them (its wire sha256, as in the cluster model).
            source = f"policy:{encode_state_dict(model).sha256[:12]}"
            tallies: list[InputTally] = []

            def rollout(runner):
                tallies.append(InputTally(runner))  # what the policy was fed (camera frames or not)
                return run_policy(n.arm, tallies[-1], n.tasks, p.variation, episodes, seed, p.max_episode_steps,
                                  source=source)
            rates = n.client.evaluate(model, rollout)
            n.log_transfer(kind="rollout_inputs", source=source, episodes=episodes, **tallies[-1].summary())
            return rates
        finally:
            n.arm_lock.release()

    def evaluate_round(self, ann: Announcement, membership: Membership, config: RoundConfig) -> None:
        n = self.node
        model = n.models.for_round(ann.round_idx, membership)
        t0 = time.monotonic()
        episodes = config.eval_episodes or n.params.eval_episodes  # the server's request, else our own
        rates = self.evaluate_model(model, episodes, seed=n.params.seed)
        mean = float(np.mean(list(rates.values())))
        msg = RobotMetrics(robot_id=n.robot_id, cluster_ids=[int(c) for c, w in membership if w > 0],
                           num_samples=0, train_loss=math.nan, val_loss=math.nan, success_rate=mean,
                           accepted=True, reason=json.dumps(rates))
        wait_for_subscribers(n, n.metrics_pub, "the fleet's robot_metrics topic")
        n.metrics_pub.publish(msg)
        n.log_transfer(kind="evaluation", round=ann.round_idx, success=rates)
        n.get_logger().info(f"round {ann.round_idx}: evaluated {rates} in {time.monotonic() - t0:.1f} s")

    def answer_evaluate(self, request, response):
        """The EvaluatePolicy service: the robot's newest model, driven on its arm."""
        n = self.node
        try:
            model, _ = n.models.newest_for(n.robot_id)
            episodes = int(request.episodes) or n.params.eval_episodes
            rates = self.evaluate_model(model, episodes, int(request.seed))
            response.ok, response.message = True, f"{episodes} episode(s) per task"
            response.tasks = list(rates)
            response.success_rates = [float(v) for v in rates.values()]
            response.mean_success_rate = float(np.mean(list(rates.values())))
        except (ValueError, RuntimeError, TimeoutError) as exc:
            response.ok, response.message = False, str(exc)
        except ShutdownRequested:
            response.ok, response.message = False, "the robot node is shutting down"
        return response

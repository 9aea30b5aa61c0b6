"""The onboard robot node: demonstrations, local training, updates, evaluation.

Interfaces (robot namespace, e.g. ``/robot_0``):

    record          fed_ros/srv/Record          START / STOP / DISCARD a demonstration (teleop)
    evaluate        fed_ros/srv/EvaluatePolicy  closed-loop evaluation of the current model
    arm/...         the arm's topics (fed_ros.ros.arm.topics), recorded and driven

and the fleet server's topics (``fleet_namespace``, default ``/fleet``): it registers,
follows ``round`` announcements, downloads its cluster model(s) from ``cluster_models``,
and answers with ``updates`` (chunked or via the zmq bulk channel), ``descriptors`` or
``robot_metrics``.

Threads: subscriptions and services run on a MultiThreadedExecutor; every long job
(bootstrap demonstrations, training, descriptors, evaluation) runs on one worker thread,
so arm topics, model chunks and resend requests keep flowing while it trains.
Parameters: config/robot.yaml.
"""
from __future__ import annotations

import json
import math
import queue
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String

from fed_ros.msg import (ClientDescriptor as DescriptorMsg, ClusterModel, ModelUpdate, RobotMetrics, RoundAnnouncement,
                         UpdateAck)
from fed_ros.ros import shutdown
from fed_ros.ros.shutdown import ShutdownRequested
from fed_ros.ros.wire import qos
from fed_ros.ros.wire.publish import wait_for_subscribers  # also imported from here by tests
from fed_ros.ros.wire.conversions import (Announcement, announcement_from_msg, descriptor_to_msg, encode_state_dict,
                                     model_update_msg)
from fed_ros.ros.fleet.params import RobotParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.core.round_config import RoundConfig
from fed_ros.core.rounds import DESCRIBE, DONE, EVALUATE, SCORE, TRAIN
from fed_ros.ros.nodes.model_cache import ModelCache
from fed_ros.core.delivery import Outbox, RetrySchedule
from fed_ros.core.validation import Decision
from fed_ros.ros.wire.transfer import Outgoing, Received, TransferReceiver, TransferSender
from fed_ros.srv import EvaluatePolicy, Record, Register

MODEL_TOPIC_DEPTH = 64  # matches the server's latched cluster-model topic


class RobotNode(Node):
    """Onboard fleet client of one robot (thin: `RobotClient` learns, arm.driving drives the arm)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("robot", **kwargs)
        # Typed, described parameters (RobotParams); a live `ros2 param set` is applied or refused.
        self.params = p = declare_typed_parameters(self, RobotParams, self._on_params_changed,
                                                   namespace=self.get_namespace())
        self.robot_id: str = p.robot_id
        self.tasks: list[str] = list(p.tasks)
        self.data_dir = Path(p.data_dir)
        self.demo_dir = self.data_dir / "demos"
        self.model_dir = self.data_dir / "models"
        self.demo_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.cameras = p.policy == "image"
        self.signer = None
        if p.private_key_file:
            from fed_ros.core.auth import Signer
            self.signer = Signer.from_file(p.private_key_file)
        self.server_key = None  # cluster models must carry the server's signature when set
        if p.allowed_keys_file:
            from fed_ros.core.auth import AllowList
            self.server_key = AllowList.from_yaml(p.allowed_keys_file).server

        if p.torch_threads:
            import torch
            torch.set_num_threads(p.torch_threads)
        from fed_ros.core.params import manifest_of
        from fed_ros.learning.client import RobotClient
        from fed_ros.learning.configuration_policy import PolicyConfig
        from fed_ros.learning.trainer import initial_state_dict
        self.policy_cfg = PolicyConfig(kind=p.policy)
        # The robot's own training settings; the round config overrides what it decides.
        self.client = RobotClient(self.robot_id, self.policy_cfg, robot_seed=p.seed, device=p.device,
                                  local=p.local_training())  # ValueError at start on a bad or forbidden setting
        self.manifest = manifest_of(initial_state_dict(self.policy_cfg))  # what cluster models must match

        fleet = p.fleet_namespace.rstrip("/")
        arm_ns = p.arm_namespace
        self._fleet_group = MutuallyExclusiveCallbackGroup()  # announcements, models, resends
        self._service_group = MutuallyExclusiveCallbackGroup()  # Record / EvaluatePolicy
        io_group = ReentrantCallbackGroup()  # arm topics (recorder, arm client)

        from fed_ros.ros.arm.bridge_eval import ArmClient
        from fed_ros.ros.arm.recorder import Recorder
        self.arm = ArmClient(self, namespace=arm_ns, cameras=self.cameras, source="policy", callback_group=io_group)
        self.recorder = Recorder(self, self.demo_dir, namespace=arm_ns, robot_id=self.robot_id,
                                 cameras=self.cameras, callback_group=io_group)

        self.update_pub = self.create_publisher(ModelUpdate, f"{fleet}/updates", qos.control_qos())
        self.descriptor_pub = self.create_publisher(DescriptorMsg, f"{fleet}/descriptors", qos.control_qos())
        self.metrics_pub = self.create_publisher(RobotMetrics, f"{fleet}/robot_metrics", qos.control_qos())
        self.model_resend_pub = self.create_publisher(String, f"{fleet}/model_resend", qos.control_qos())
        # No handler can crash the node: failures are logged with their type and counted.
        from fed_ros.ros.nodes.handler_guard import HandlerGuard, refuse_service
        self.guard = guard = HandlerGuard(self)
        self.create_subscription(RoundAnnouncement, f"{fleet}/round", guard.wrap("round", self._on_announcement),
                                 qos.latched_qos(),
                                 callback_group=self._fleet_group)
        self.create_subscription(ClusterModel, f"{fleet}/cluster_models",
                                 guard.wrap("cluster_models", self._on_cluster_model),
                                 qos.model_state_qos(MODEL_TOPIC_DEPTH), callback_group=self._fleet_group)
        self.create_subscription(String, f"{fleet}/update_resend", guard.wrap("update_resend", self._on_update_resend),
                                 qos.control_qos(),
                                 callback_group=self._fleet_group)
        self.create_subscription(DescriptorMsg, f"{fleet}/descriptors",
                                 guard.wrap("descriptors", self._on_peer_descriptor),
                                 qos.control_qos(), callback_group=self._fleet_group)
        self.create_subscription(UpdateAck, f"{fleet}/update_acks", guard.wrap("update_acks", self._on_update_ack),
                                 qos.control_qos(), callback_group=self._fleet_group)
        self.register_client = self.create_client(Register, f"{fleet}/register", callback_group=io_group)
        self.create_service(Record, "record", guard.wrap("record", self._on_record, refuse_service),
                            callback_group=self._service_group)
        self.create_service(EvaluatePolicy, "evaluate", guard.wrap("evaluate", self._on_evaluate, refuse_service),
                            callback_group=self._service_group)
        self.create_timer(0.5, self._tick, callback_group=self._fleet_group)

        # Transfer: cluster models in (the one payload check), updates out (kept until acknowledged).
        self.models_in = TransferReceiver(self.manifest, max_pending=8,
                                          on_event=lambda text: self.get_logger().warning(text))
        self.updates_out = TransferSender(p.transfer_channel, bulk_threshold_bytes=p.bulk_threshold_bytes)
        self.outbox = Outbox(RetrySchedule(first_s=p.update_retry_s, max_s=max(10.0, p.update_retry_s)))
        self.models = ModelCache()  # the receive path stores into it (aliases below)
        self._models_lock, self.cluster_models = self.models.lock, self.models.entries
        self._latest: Announcement | None = None
        self._latest_stamp = 0
        self._handled: set[tuple[int, str, int]] = set()
        self._registered = threading.Event()
        self._jobs: queue.Queue = queue.Queue()
        self._peer_predictors: dict[tuple[int, str], bytes] = {}
        self._stop = threading.Event()
        self._arm_lock = threading.Lock()  # one driver at a time (bootstrap, EVALUATE stage, service)
        self.failed: str = ""
        self._transfer_log = open(self.data_dir / "transfers.jsonl", "a", encoding="utf-8")
        self._worker = threading.Thread(target=self._work, name=f"{self.robot_id}-worker", daemon=True)
        self._worker.start()
        self._jobs.put(("startup", None))
        self.get_logger().info(f"robot {self.robot_id}: tasks {self.tasks}, data in {self.data_dir}, "
                               f"policy {p.policy}")

    def _on_params_changed(self, params: RobotParams) -> None:
        """A live parameter change (already checked): training settings reach the next round's fit."""
        self.params = params
        self.client.local.update(params.local_training())
        self.get_logger().info("parameters changed live; training settings now "
                               f"{params.local_training()}, eval_episodes {params.eval_episodes}")

    # ------------------------------------------------------------------ bookkeeping
    def _log_transfer(self, **entry: Any) -> None:
        entry["time"] = round(time.time(), 3)
        self._transfer_log.write(json.dumps(entry) + "\n")
        self._transfer_log.flush()

    def _work(self) -> None:
        """The worker thread: one long job at a time, in order."""
        while not self._stop.is_set():
            try:
                kind, arg = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                if kind == "startup":
                    self._startup()
                elif kind == "announcement":
                    self._handle_announcement(arg)
            except ShutdownRequested:
                return
            except Exception as exc:  # noqa: BLE001 - report, keep the node alive for the next round
                if self._stop.is_set() or shutdown.requested():
                    return  # e.g. a publisher whose context just went away: not an error
                import traceback
                self.get_logger().error(f"{kind} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                if kind == "startup":
                    self.failed = f"startup failed: {exc}"

    # ------------------------------------------------------------------ start-up
    def _episodes(self):
        """Successful demonstrations: ROS recordings under demos/ plus Episode .npz files there."""
        from fed_ros.ros.arm.driving import local_episodes
        return local_episodes(self.demo_dir)

    def _startup(self) -> None:
        wanted = self.params.collect_demos_on_start
        have = len(self._episodes()) if wanted else 0
        if wanted > have:
            self._collect_demos(wanted - have, first_index=have)
        self._register()

    def _collect_demos(self, count: int, first_index: int = 0) -> None:
        """Drive the arm with the scripted expert over ROS and record each episode (the ROS path)."""
        from fed_ros.ros.arm.driving import record_expert_demos
        p, log = self.params, self.get_logger()
        log.info(f"recording {count} demonstration(s): the scripted expert drives the arm over ROS")
        with self._arm_lock:
            record_expert_demos(self.arm, self.recorder, self.tasks, count, first_index, demo_seed=p.demo_seed,
                                noise_std=p.demo_noise_std, variation=p.variation,
                                max_steps=p.max_episode_steps, info=log.info, error=log.error)

    def _register(self) -> None:
        p = self.params
        deadline = time.monotonic() + p.register_timeout_s
        num_samples = sum(len(e) for e in self._episodes())
        import torch
        while not self._stop.is_set():
            if self.register_client.wait_for_service(timeout_sec=1.0):
                from fed_ros.ros.wire.register import register_request
                # Signed (fresh timestamp + nonce each attempt) when the robot has a key: a server
                # with require_signatures admits only proof of possession of the allow-listed key.
                request = register_request(
                    self.robot_id, tasks=self.tasks, cameras=["agentview", "wrist"] if self.cameras else [],
                    action_dim=4, has_gpu=bool(torch.cuda.is_available()), num_samples=num_samples,
                    signer=self.signer)
                shutdown.check(self._stop)
                response = self._call(self.register_client, request, 10.0)
                if response is not None:
                    if not response.accepted:
                        raise RuntimeError(f"registration refused: {response.reason}")
                    self._registered.set()
                    self.get_logger().info(f"registered with the fleet (server round {response.current_round})")
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fleet server answered within {p.register_timeout_s:.0f} s")

    def _call(self, client, request, timeout: float):
        future = client.call_async(request)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        try:
            answered = shutdown.wait_for(done, timeout, self._stop)
        finally:
            if not done.is_set():
                client.remove_pending_request(future)
        return future.result() if answered else None

    # ------------------------------------------------------------------ fleet messages
    def _on_announcement(self, msg) -> None:
        try:
            ann = announcement_from_msg(msg)
        except ValueError as exc:
            self.get_logger().warning(f"bad round announcement: {exc}")
            return
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        self._latest, self._latest_stamp = ann, stamp
        if ann.stage == DONE:
            self.get_logger().info(f"federation finished at round {ann.round_idx}")
            return
        if self.robot_id not in ann.participants:
            return
        key = (ann.round_idx, ann.stage, stamp)
        if key in self._handled:
            return
        self._handled.add(key)
        self._jobs.put(("announcement", (ann, stamp)))

    def _on_cluster_model(self, msg) -> None:
        cid, round_idx = int(msg.cluster_id), int(msg.round)
        with self._models_lock:
            held = self.cluster_models.get(cid)
        if held is not None and held[0] >= round_idx:
            return  # older or the same version (latched history, resend)
        result = self.models_in.offer(msg.payload, tag=msg)
        if result is not None:
            self._store_model(result)

    def _store_model(self, result: Received) -> None:
        from fed_ros.core.validation import validate_cluster_model
        msg = result.tag
        cid, round_idx, members = int(msg.cluster_id), int(msg.round), list(msg.member_robot_ids)
        sha256 = msg.payload.sha256
        with self._models_lock:
            held = self.cluster_models.get(cid)
        # The receiver checked size, manifest and values; here: no rollback, server signature, digest.
        decision = result.decision and validate_cluster_model(
            cluster_id=cid, round_idx=round_idx, params=None, expected_manifest=None,
            total_bytes=int(msg.payload.total_bytes), payload_sha256=sha256, received_sha256=result.sha256,
            signature=bytes(msg.signature), server_public_key=self.server_key,
            last_round=held[0] if held else None)
        if not decision:
            self.get_logger().warning(f"cluster {cid} model for round {round_idx} rejected ({decision.code}): "
                                      f"{decision.reason}")
            return
        with self._models_lock:
            held = self.cluster_models.get(cid)
            if held is not None and held[0] >= round_idx:
                return
            self.cluster_models[cid] = (round_idx, result.params, sha256, members)
            self._models_lock.notify_all()
        self._log_transfer(kind="cluster_model_received", cluster_id=cid, round=round_idx, sha256=sha256,
                           bytes=result.nbytes, members=members)
        self.get_logger().info(f"received cluster {cid} model for round {round_idx} ({result.nbytes} B, "
                               f"{sha256[:12]})")

    def _on_update_resend(self, msg) -> None:
        try:
            answer = self.updates_out.resend(msg.data)
        except ValueError:
            return  # malformed, or indices of another robot's payload of the same id (never ours)
        if answer is not None:
            out, chunks = answer
            for chunk in chunks:
                self.update_pub.publish(model_update_msg(chunk, **out.meta))
            self.get_logger().info(f"resent {len(chunks)} chunk(s) of {out.payload_id}")

    def _on_update_ack(self, msg) -> None:
        """The server's decision on our update: stop re-sending it; a rejection's reason is logged."""
        if msg.robot_id != self.robot_id:
            return
        decision = Decision(bool(msg.accepted), str(msg.code), str(msg.reason))
        if self.outbox.acknowledge(str(msg.payload_id), decision) is None:
            return  # not ours any more, or acknowledged before
        self._log_transfer(kind="update_ack", round=int(msg.round), payload_id=str(msg.payload_id),
                           accepted=decision.accepted, code=decision.code, reason=decision.reason)
        if decision:
            self.get_logger().info(f"round {msg.round}: update accepted by the server")
        else:
            self.get_logger().warning(f"round {msg.round}: update rejected by the server ({decision.code}): "
                                      f"{decision.reason}")

    def _on_peer_descriptor(self, msg) -> None:
        if int(msg.kind) == DescriptorMsg.KIND_RND and len(msg.payload):
            self._peer_predictors[(int(msg.round), str(msg.robot_id))] = bytes(msg.payload)

    def _tick(self) -> None:
        for request in self.models_in.resend_requests():
            self.model_resend_pub.publish(String(data=request))
        for result in self.models_in.completed():
            self._store_model(result)
        if self.update_pub.get_subscription_count() > 0:  # re-send only when someone can hear it
            for entry in self.outbox.due():
                self.get_logger().warning(f"round {entry.round_idx}: update not acknowledged; re-sending "
                                          f"(send {entry.sends})")
                self._publish_update(entry.item)

    # ------------------------------------------------------------------ models
    # ------------------------------------------------------------------ round work
    def _handle_announcement(self, item: tuple[Announcement, int]) -> None:
        ann, stamp = item
        shutdown.wait_for(self._registered, math.inf, self._stop)
        if self._latest_stamp != stamp and self._latest is not None and (
                self._latest.round_idx, self._latest.stage) != (ann.round_idx, ann.stage):
            return  # superseded while queued (e.g. a straggler's stage already closed)
        if ann.deadline_s < time.time():
            self.get_logger().warning(f"round {ann.round_idx} {ann.stage}: deadline already passed, skipping")
            return
        membership = ann.memberships.get(self.robot_id, [])
        config = ann.configs.get(self.robot_id, RoundConfig())  # validated on receipt; obeyed as is
        self.get_logger().info(f"round {ann.round_idx} {ann.stage}: obeying {config}")
        if ann.stage == TRAIN:
            self._train_round(ann, membership, config)
        elif ann.stage == DESCRIBE:
            self._publish_descriptor(self.client.describe(config.descriptor_kind, self._episodes()), ann.round_idx)
        elif ann.stage == SCORE:
            self._score(ann)
        elif ann.stage == EVALUATE:
            self._evaluate_round(ann, membership, config)

    def _train_round(self, ann: Announcement, membership: list[tuple[int, float]], config: RoundConfig) -> None:
        cached = self.outbox.for_round(ann.round_idx)
        if cached is not None:
            # Re-announced (server restarted or the round was retried): the cached update goes
            # again under a fresh nonce and id (the round's earlier nonce may be spent); no retraining.
            self._offer_update(cached.item, ann, dict(cached.item.meta))
            self.get_logger().info(f"round {ann.round_idx}: re-sent the update already trained")
            return
        from fed_ros.learning.weights import save_checkpoint

        episodes = self._episodes()
        if not episodes:
            raise RuntimeError("no successful demonstrations to train on (Record some first)")
        cluster_id = int(max(membership, key=lambda m: m[1])[0]) if membership else -1
        if config.pick_cluster and len(membership) > 1:
            candidates = {c: self.models.for_round(ann.round_idx, [(c, 1.0)]) for c, _ in membership}
            cluster_id = self.client.pick_cluster(candidates, episodes)
            start = candidates[cluster_id]
        else:
            start = self.models.for_round(ann.round_idx, membership)
        t0 = time.monotonic()
        result = self.client.fit(start, config, episodes, ann.round_idx, on_step=self._on_train_step(ann.round_idx))
        metrics = result.metrics
        save_checkpoint(self.model_dir / f"local_round_{ann.round_idx:04d}.safetensors", result.params,
                        self.policy_cfg)
        fields = dict(cluster_id=cluster_id, num_samples=result.num_samples,
                      train_loss=float(metrics.get("loss_bc", metrics.get("loss_total", math.nan))),
                      val_loss=float(metrics.get("val_nll", math.nan)))
        out = self._offer_update(encode_state_dict(result.params), ann, fields)
        self.get_logger().info(
            f"round {ann.round_idx}: trained {int(metrics.get('steps', 0))} steps in {time.monotonic() - t0:.1f} s "
            f"(bc {fields['train_loss']:.3f}), sent update {out.encoded.total_bytes} B {out.encoded.sha256[:12]}")

    def _offer_update(self, payload, ann: Announcement, fields: dict[str, Any]) -> Outgoing:
        """Sign and send an update (new bytes, or a cached Outgoing's); keep it until acknowledged."""
        nonce = secrets.token_bytes(16)
        pid = f"{self.robot_id}/r{ann.round_idx}/update/{nonce.hex()[:8]}"
        header = dict(fields, robot_id=self.robot_id, round_idx=ann.round_idx, base_round=ann.round_idx,
                      nonce=nonce, signature=b"")
        out = (self.updates_out.reissue(payload, pid, **header) if isinstance(payload, Outgoing)
               else self.updates_out.prepare(payload, pid, **header))
        if self.signer is not None:
            out.meta["signature"] = self.signer.sign_update(
                ann.round_idx, self.robot_id, nonce, out.encoded.sha256, base_round=ann.round_idx,
                num_samples=fields["num_samples"], cluster_id=fields["cluster_id"])
        self._send_update(out)
        # The announcement's deadline is wall-clock time; the outbox runs on the monotonic clock.
        deadline = time.monotonic() + (ann.deadline_s - time.time())
        if self.outbox.reopen(ann.round_idx, pid, out, deadline) is None:
            self.outbox.add(ann.round_idx, pid, out, deadline)
        self.outbox.forget_before(ann.round_idx - 1)
        self._log_transfer(kind="update_sent", round=ann.round_idx, payload_id=pid, sha256=out.encoded.sha256,
                           bytes=out.encoded.total_bytes, channel=out.channel)
        return out

    def _on_train_step(self, round_idx: int) -> Callable[[int, dict[str, float]], None]:
        """Called between optimiser steps: stops training on shutdown; logs progress every ~10 s."""
        last = [time.monotonic()]

        def on_step(step: int, values: dict[str, float]) -> None:
            shutdown.check(self._stop)
            if time.monotonic() - last[0] >= 10.0:
                last[0] = time.monotonic()
                self.get_logger().info(f"round {round_idx}: training, step {step} (bc {values.get('bc', math.nan):.3f})")
        return on_step

    def _send_update(self, out: Outgoing) -> None:
        wait_for_subscribers(self, self.update_pub, "the fleet's updates topic")
        self._publish_update(out)

    def _publish_update(self, out: Outgoing) -> None:
        for chunk in out.chunks():
            self.update_pub.publish(model_update_msg(chunk, **out.meta))

    def _score(self, ann: Announcement) -> None:
        """RND phase two: wait (bounded) for the peers' predictors, then score them on local data."""
        deadline = time.monotonic() + 30.0
        peers = [r for r in ann.participants if r != self.robot_id]
        while any((ann.round_idx, r) not in self._peer_predictors for r in peers) and time.monotonic() < deadline:
            shutdown.sleep(0.1, self._stop)
        predictors = {r: self._peer_predictors[(ann.round_idx, r)] for r in peers
                      if (ann.round_idx, r) in self._peer_predictors}
        self._publish_descriptor(self.client.score(predictors, self._episodes()), ann.round_idx)

    def _publish_descriptor(self, desc, round_idx: int) -> None:
        nonce = secrets.token_bytes(16)
        signature = b""
        if self.signer is not None:
            from fed_ros.core.validation import digest_of_descriptor
            signature = self.signer.sign_descriptor(round_idx, self.robot_id, nonce, digest_of_descriptor(desc))
        msg = descriptor_to_msg(desc, round_idx, nonce=nonce, signature=signature)
        wait_for_subscribers(self, self.descriptor_pub, "the fleet's descriptors topic")
        self.descriptor_pub.publish(msg)
        self.get_logger().info(f"round {round_idx}: sent {desc.kind} descriptor")

    # ------------------------------------------------------------------ evaluation
    def evaluate_model(self, model: dict[str, np.ndarray], episodes: int, seed: int
                       ) -> dict[str, float]:
        """Closed-loop success rate per task, driving this robot's arm over ROS."""
        from fed_ros.ros.arm.driving import run_policy
        p = self.params
        deadline = time.monotonic() + 600.0
        while not self._arm_lock.acquire(timeout=shutdown.POLL_S):
            shutdown.check(self._stop)
            if time.monotonic() > deadline:
                raise TimeoutError("the arm is busy (another evaluation or demonstration run)")
        try:
            # Commands name the model that produced them (its wire sha256, as in the cluster model).
            source = f"policy:{encode_state_dict(model).sha256[:12]}"
            return self.client.evaluate(model, lambda runner: run_policy(
                self.arm, runner, self.tasks, p.variation, episodes, seed, p.max_episode_steps,
                source=source))
        finally:
            self._arm_lock.release()

    def _evaluate_round(self, ann: Announcement, membership: list[tuple[int, float]], config: RoundConfig) -> None:
        model = self.models.for_round(ann.round_idx, membership)
        t0 = time.monotonic()
        episodes = config.eval_episodes or self.params.eval_episodes  # the server's request, else our own
        rates = self.evaluate_model(model, episodes, seed=self.params.seed)
        mean = float(np.mean(list(rates.values())))
        msg = RobotMetrics(robot_id=self.robot_id, cluster_ids=[int(c) for c, w in membership if w > 0],
                           num_samples=0, train_loss=math.nan, val_loss=math.nan, success_rate=mean,
                           accepted=True, reason=json.dumps(rates))
        wait_for_subscribers(self, self.metrics_pub, "the fleet's robot_metrics topic")
        self.metrics_pub.publish(msg)
        self._log_transfer(kind="evaluation", round=ann.round_idx, success=rates)
        self.get_logger().info(f"round {ann.round_idx}: evaluated {rates} in {time.monotonic() - t0:.1f} s")

    # ------------------------------------------------------------------ services
    def _on_record(self, request, response):
        from fed_ros.ros.arm.driving import answer_record
        return answer_record(self.recorder, request, response, self.tasks[0], self.params.variation)

    def _on_evaluate(self, request, response):
        try:
            model, _ = self.models.newest_for(self.robot_id)
            episodes = int(request.episodes) or self.params.eval_episodes
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

    def destroy_node(self) -> None:
        """Stop the worker, the bulk server and the recorder."""
        # Defensive: also called by rclpy's context clean-up after a failed constructor.
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
            self._worker.join(timeout=2.0)
        if getattr(self, "updates_out", None) is not None:
            self.updates_out.close()
        if getattr(self, "models_in", None) is not None:
            self.models_in.close()
        if getattr(self, "recorder", None) is not None:
            self.recorder.destroy()
        if getattr(self, "_transfer_log", None) is not None:
            self._transfer_log.close()
        super().destroy_node()



def main(args: list[str] | None = None) -> int:
    """Run the robot node until Ctrl-C / SIGTERM (exit 0) or a failed start-up (exit 1)."""
    shutdown.init(args)  # Ctrl-C sets a flag every wait observes (fed_ros.ros.shutdown)
    node = None
    code = 0
    try:
        try:
            node = RobotNode()
        except ValueError as exc:
            print(f"fed_ros robot: invalid configuration: {exc}", file=sys.stderr)
            return 2
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)
        while rclpy.ok() and not node.failed and not shutdown.requested():
            executor.spin_once(timeout_sec=0.1)
        if node.failed and not shutdown.requested():
            node.get_logger().fatal(node.failed)
            code = 1
    except (KeyboardInterrupt, ExternalShutdownException):
        code = 0
    finally:
        if node is not None:
            node.destroy_node()  # stops the worker: its waits give up within shutdown.POLL_S
        rclpy.try_shutdown()
        shutdown.prepare_exit()
    return code


if __name__ == "__main__":
    sys.exit(main())

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

from fed_ros.msg import ClientDescriptor as DescriptorMsg, ClusterModel, ModelUpdate, RobotMetrics, RoundAnnouncement
from fed_ros.ros.wire import qos
from fed_ros.ros.wire.conversions import (Announcement, announcement_from_msg, descriptor_to_msg, encode_state_dict,
                                     model_update_msg)
from fed_ros.ros.fleet.plan import ROBOT_DEFAULTS, validate_robot_params
from fed_ros.core.round_config import RoundConfig
from fed_ros.core.rounds import DESCRIBE, DONE, EVALUATE, SCORE, TRAIN
from fed_ros.ros.nodes.model_cache import ModelCache
from fed_ros.ros.wire.transport import (BULK_THRESHOLD_BYTES, BulkServer, ChunkedSender, PayloadAssembler,
                                   PayloadRejected, decode_resend_request, encode_resend_request, fetch_bulk)
from fed_ros.srv import EvaluatePolicy, Record, Register

_ROS_BUILTIN_PARAMS = {"use_sim_time", "start_type_description_service"}
MODEL_TOPIC_DEPTH = 64  # matches the server's latched cluster-model topic


class RobotNode(Node):
    """Onboard fleet client of one robot (thin: `RobotClient` learns, arm.driving drives the arm)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("robot", allow_undeclared_parameters=True,
                         automatically_declare_parameters_from_overrides=True, **kwargs)
        for name, default in ROBOT_DEFAULTS.items():
            if not self.has_parameter(name):
                self.declare_parameter(name, default)
        names = self.list_parameters([], 0).names
        raw = {n: self.get_parameter(n).value for n in names if n not in _ROS_BUILTIN_PARAMS}
        self.params = p = validate_robot_params(raw, self.get_namespace())
        self.robot_id: str = p["robot_id"]
        self.tasks: list[str] = list(p["tasks"])
        self.data_dir = Path(p["data_dir"])
        self.demo_dir = self.data_dir / "demos"
        self.model_dir = self.data_dir / "models"
        self.demo_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.cameras = p["policy"] == "image"
        self.signer = None
        if p["private_key_file"]:
            from fed_ros.core.auth import Signer
            self.signer = Signer.from_file(p["private_key_file"])
        self.server_key = None  # cluster models must carry the server's signature when set
        if p["allowed_keys_file"]:
            from fed_ros.core.auth import AllowList
            self.server_key = AllowList.from_yaml(p["allowed_keys_file"]).server

        if p["torch_threads"]:
            import torch
            torch.set_num_threads(p["torch_threads"])
        from fed_ros.core.params import manifest_of
        from fed_ros.learning.client import RobotClient
        from fed_ros.learning.configuration_policy import PolicyConfig
        from fed_ros.learning.trainer import initial_state_dict
        self.policy_cfg = PolicyConfig(kind=p["policy"])
        # The robot's own training settings; the round config overrides what it decides.
        local = {"lr": p["train_lr"], "batch_size": p["train_batch_size"], "max_steps": p["train_max_steps"] or None}
        local.update({k[len("trainer."):]: v for k, v in p.items() if k.startswith("trainer.")})
        self.client = RobotClient(self.robot_id, self.policy_cfg, robot_seed=p["seed"], device=p["device"],
                                  local=local)  # ValueError at start on a bad or forbidden setting
        self.manifest = manifest_of(initial_state_dict(self.policy_cfg))  # what cluster models must match

        fleet = p["fleet_namespace"].rstrip("/")
        arm_ns = p["arm_namespace"]
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
        self.create_subscription(RoundAnnouncement, f"{fleet}/round", self._on_announcement, qos.latched_qos(),
                                 callback_group=self._fleet_group)
        self.create_subscription(ClusterModel, f"{fleet}/cluster_models", self._on_cluster_model,
                                 qos.model_state_qos(MODEL_TOPIC_DEPTH), callback_group=self._fleet_group)
        self.create_subscription(String, f"{fleet}/update_resend", self._on_update_resend, qos.control_qos(),
                                 callback_group=self._fleet_group)
        self.create_subscription(DescriptorMsg, f"{fleet}/descriptors", self._on_peer_descriptor,
                                 qos.control_qos(), callback_group=self._fleet_group)
        self.register_client = self.create_client(Register, f"{fleet}/register", callback_group=io_group)
        self.create_service(Record, "record", self._on_record, callback_group=self._service_group)
        self.create_service(EvaluatePolicy, "evaluate", self._on_evaluate, callback_group=self._service_group)
        self.create_timer(0.5, self._tick, callback_group=self._fleet_group)

        self.model_assembler = PayloadAssembler(max_pending=8)
        self.models = ModelCache()  # the receive path stores into it (aliases below)
        self._models_lock, self.cluster_models = self.models.lock, self.models.entries
        self._latest: Announcement | None = None
        self._latest_stamp = 0
        self._handled: set[tuple[int, str, int]] = set()
        self._registered = threading.Event()
        self._jobs: queue.Queue = queue.Queue()
        self._update_senders: dict[int, tuple[ChunkedSender, dict[str, Any]]] = {}
        self._peer_predictors: dict[tuple[int, str], bytes] = {}
        self._bulk: BulkServer | None = None
        self._stop = threading.Event()
        self._arm_lock = threading.Lock()  # one driver at a time (bootstrap, EVALUATE stage, service)
        self.failed: str = ""
        self._transfer_log = open(self.data_dir / "transfers.jsonl", "a", encoding="utf-8")
        self._worker = threading.Thread(target=self._work, name=f"{self.robot_id}-worker", daemon=True)
        self._worker.start()
        self._jobs.put(("startup", None))
        self.get_logger().info(f"robot {self.robot_id}: tasks {self.tasks}, data in {self.data_dir}, "
                               f"policy {p['policy']}")

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
            except Exception as exc:  # noqa: BLE001 - report, keep the node alive for the next round
                import traceback
                self.get_logger().error(f"{kind} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                if kind == "startup":
                    self.failed = f"startup failed: {exc}"

    # ------------------------------------------------------------------ start-up
    def _episodes(self):
        """Successful demonstrations: ROS recordings under demos/ plus Episode .npz files there."""
        from fed_ros.core.episode import Episode
        from fed_ros.ros.arm.recorder import load_recorded_episodes
        episodes = load_recorded_episodes(self.demo_dir)
        episodes += [e for e in (Episode.load(f) for f in sorted(self.demo_dir.glob("*.npz"))) if e.success]
        return episodes

    def _startup(self) -> None:
        wanted = self.params["collect_demos_on_start"]
        have = len(self._episodes()) if wanted else 0
        if wanted > have:
            self._collect_demos(wanted - have, first_index=have)
        self._register()

    def _collect_demos(self, count: int, first_index: int = 0) -> None:
        """Drive the arm with the scripted expert over ROS and record each episode (the ROS path)."""
        from fed_ros.ros.arm.driving import record_expert_demos
        p, log = self.params, self.get_logger()
        with self._arm_lock:
            record_expert_demos(self.arm, self.recorder, self.tasks, count, first_index, demo_seed=p["demo_seed"],
                                noise_std=p["demo_noise_std"], variation=p["variation"],
                                max_steps=p["max_episode_steps"], info=log.info, error=log.error)

    def _register(self) -> None:
        p = self.params
        deadline = time.monotonic() + p["register_timeout_s"]
        num_samples = sum(len(e) for e in self._episodes())
        import torch
        while not self._stop.is_set():
            if self.register_client.wait_for_service(timeout_sec=1.0):
                request = Register.Request(
                    robot_id=self.robot_id, tasks=self.tasks, cameras=["agentview", "wrist"] if self.cameras else [],
                    action_dim=4, has_gpu=bool(torch.cuda.is_available()), num_samples=num_samples)
                if self.signer is not None:
                    request.public_key = list(self.signer.public_key)
                response = self._call(self.register_client, request, 10.0)
                if response is not None:
                    if not response.accepted:
                        raise RuntimeError(f"registration refused: {response.reason}")
                    self._registered.set()
                    self.get_logger().info(f"registered with the fleet (server round {response.current_round})")
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no fleet server answered within {p['register_timeout_s']:.0f} s")

    def _call(self, client, request, timeout: float):
        future = client.call_async(request)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout):
            client.remove_pending_request(future)
            return None
        return future.result()

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
        payload = msg.payload
        cid, round_idx = int(msg.cluster_id), int(msg.round)
        with self._models_lock:
            held = self.cluster_models.get(cid)
        if held is not None and held[0] >= round_idx:
            return  # older or the same version (latched history, resend)
        try:
            if payload.bulk_uri:
                threading.Thread(target=self._fetch_model, args=(msg,), daemon=True).start()
                return
            complete = self.model_assembler.add(payload)
        except PayloadRejected as exc:
            self.get_logger().warning(f"cluster model {payload.payload_id} rejected: {exc}")
            return
        if complete is not None:
            self._store_model(msg, complete.state_dict(copy=True), complete.sha256, complete.data.nbytes)

    def _fetch_model(self, msg) -> None:
        from fed_ros.ros.wire.conversions import decode_state_dict, manifest_from_msgs
        payload = msg.payload
        try:
            data = fetch_bulk(payload)
        except Exception as exc:  # noqa: BLE001
            self.get_logger().warning(f"cluster model {payload.payload_id}: bulk fetch failed: {exc}")
            return
        params = decode_state_dict(manifest_from_msgs(payload.manifest), int(payload.encoding), data,
                                   np.asarray(payload.scales, np.float32), copy=True)
        self._store_model(msg, params, payload.sha256, int(data.nbytes))

    def _store_model(self, msg, params: dict, received_sha256: str, nbytes: int) -> None:
        from fed_ros.core.validation import validate_cluster_model
        cid, round_idx, members = int(msg.cluster_id), int(msg.round), list(msg.member_robot_ids)
        sha256 = msg.payload.sha256
        with self._models_lock:
            held = self.cluster_models.get(cid)
        # Size, exact manifest, finite values, no rollback, server signature, digest.
        decision = validate_cluster_model(
            cluster_id=cid, round_idx=round_idx, params=params, expected_manifest=self.manifest,
            total_bytes=int(msg.payload.total_bytes), payload_sha256=sha256, received_sha256=received_sha256,
            signature=bytes(msg.signature), server_public_key=self.server_key,
            last_round=held[0] if held else None)
        if not decision:
            self.get_logger().warning(f"cluster {cid} model for round {round_idx} rejected: {decision.reason}")
            return
        with self._models_lock:
            held = self.cluster_models.get(cid)
            if held is not None and held[0] >= round_idx:
                return
            self.cluster_models[cid] = (round_idx, params, sha256, members)
            self._models_lock.notify_all()
        self._log_transfer(kind="cluster_model_received", cluster_id=cid, round=round_idx, sha256=sha256,
                           bytes=nbytes, members=members)
        self.get_logger().info(f"received cluster {cid} model for round {round_idx} ({nbytes} B, {sha256[:12]})")

    def _on_update_resend(self, msg) -> None:
        try:
            pid, chunks = decode_resend_request(msg.data)
        except ValueError:
            return
        for sender, header in self._update_senders.values():
            if sender.payload_id == pid:
                for chunk in sender.resend([c for c in chunks if c < sender.chunk_count]):
                    self.update_pub.publish(model_update_msg(chunk, **header))
                self.get_logger().info(f"resent {len(chunks)} chunk(s) of {pid}")

    def _on_peer_descriptor(self, msg) -> None:
        if int(msg.kind) == DescriptorMsg.KIND_RND and len(msg.payload):
            self._peer_predictors[(int(msg.round), str(msg.robot_id))] = bytes(msg.payload)

    def _tick(self) -> None:
        for pid, missing in self.model_assembler.stalled().items():
            if missing:
                self.model_resend_pub.publish(String(data=encode_resend_request(pid, missing)))

    # ------------------------------------------------------------------ models
    # ------------------------------------------------------------------ round work
    def _handle_announcement(self, item: tuple[Announcement, int]) -> None:
        ann, stamp = item
        self._registered.wait()
        if self._latest_stamp != stamp and self._latest is not None and (
                self._latest.round_idx, self._latest.stage) != (ann.round_idx, ann.stage):
            return  # superseded while queued (e.g. a straggler's stage already closed)
        if ann.deadline_s < time.time():
            self.get_logger().warning(f"round {ann.round_idx} {ann.stage}: deadline already passed, skipping")
            return
        membership = ann.memberships.get(self.robot_id, [])
        config = ann.configs.get(self.robot_id, RoundConfig())  # validated on receipt; obeyed as is
        if ann.stage == TRAIN:
            self._train_round(ann, membership, config)
        elif ann.stage == DESCRIBE:
            self._publish_descriptor(self.client.describe(config.descriptor_kind, self._episodes()), ann.round_idx)
        elif ann.stage == SCORE:
            self._score(ann)
        elif ann.stage == EVALUATE:
            self._evaluate_round(ann, membership, config)

    def _train_round(self, ann: Announcement, membership: list[tuple[int, float]], config: RoundConfig) -> None:
        if ann.round_idx in self._update_senders:
            # Re-announced (server restarted or the round was retried): resend, do not retrain.
            sender, header = self._update_senders[ann.round_idx]
            self._send_update(sender, header)
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
        result = self.client.fit(start, config, episodes, ann.round_idx)
        metrics = result.metrics
        save_checkpoint(self.model_dir / f"local_round_{ann.round_idx:04d}.safetensors", result.params,
                        self.policy_cfg)
        encoded = encode_state_dict(result.params)
        nonce = secrets.token_bytes(16)
        uri = ""
        if self.params["transfer_channel"] in ("auto", "zmq") and (
                encoded.total_bytes >= BULK_THRESHOLD_BYTES or self.params["transfer_channel"] == "zmq"):
            if self._bulk is None:
                self._bulk = BulkServer(ttl_s=3600.0)
            uri = self._bulk.offer(encoded.data)
        pid = f"{self.robot_id}/r{ann.round_idx}/update/{nonce.hex()[:8]}"
        sender = ChunkedSender(encoded, pid, bulk_uri=uri)
        signature = b""
        if self.signer is not None:
            signature = self.signer.sign_update(ann.round_idx, self.robot_id, nonce, encoded.sha256,
                                                base_round=ann.round_idx, num_samples=result.num_samples,
                                                cluster_id=cluster_id)
        header = dict(robot_id=self.robot_id, round_idx=ann.round_idx, base_round=ann.round_idx,
                      cluster_id=cluster_id, num_samples=result.num_samples,
                      train_loss=float(metrics.get("loss_bc", metrics.get("loss_total", math.nan))),
                      val_loss=float(metrics.get("val_nll", math.nan)), nonce=nonce, signature=signature)
        self._update_senders = {r: v for r, v in self._update_senders.items() if r >= ann.round_idx - 1}
        self._update_senders[ann.round_idx] = (sender, header)
        self._send_update(sender, header)
        self._log_transfer(kind="update_sent", round=ann.round_idx, payload_id=pid, sha256=encoded.sha256,
                           bytes=encoded.total_bytes, channel="zmq" if uri else "ros")
        self.get_logger().info(
            f"round {ann.round_idx}: trained {int(metrics.get('steps', 0))} steps in {time.monotonic() - t0:.1f} s "
            f"(bc {header['train_loss']:.3f}), sent update {encoded.total_bytes} B {encoded.sha256[:12]}")

    def _send_update(self, sender: ChunkedSender, header: dict[str, Any]) -> None:
        wait_for_subscribers(self, self.update_pub, "the fleet's updates topic")
        for chunk in sender.chunks():
            self.update_pub.publish(model_update_msg(chunk, **header))

    def _score(self, ann: Announcement) -> None:
        """RND phase two: wait (bounded) for the peers' predictors, then score them on local data."""
        deadline = time.monotonic() + 30.0
        peers = [r for r in ann.participants if r != self.robot_id]
        while any((ann.round_idx, r) not in self._peer_predictors for r in peers) and time.monotonic() < deadline:
            time.sleep(0.1)
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
        if not self._arm_lock.acquire(timeout=600.0):
            raise TimeoutError("the arm is busy (another evaluation or demonstration run)")
        try:
            # Commands name the model that produced them (its wire sha256, as in the cluster model).
            source = f"policy:{encode_state_dict(model).sha256[:12]}"
            return self.client.evaluate(model, lambda runner: run_policy(
                self.arm, runner, self.tasks, p["variation"], episodes, seed, p["max_episode_steps"],
                source=source))
        finally:
            self._arm_lock.release()

    def _evaluate_round(self, ann: Announcement, membership: list[tuple[int, float]], config: RoundConfig) -> None:
        model = self.models.for_round(ann.round_idx, membership)
        t0 = time.monotonic()
        episodes = config.eval_episodes or self.params["eval_episodes"]  # the server's request, else our own
        rates = self.evaluate_model(model, episodes, seed=self.params["seed"])
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
        try:
            if request.command == Record.Request.START:
                path = self.recorder.start(request.task or self.tasks[0], request.instruction,
                                           request.variation or self.params["variation"])
                response.ok, response.message, response.episode_path = True, "recording", str(path)
            elif request.command == Record.Request.STOP:
                result = self.recorder.stop(bool(request.success))
                response.ok, response.episode_path = True, str(result.path)
                response.num_steps = int(result.num_steps)
                response.message = "saved" if result.success else "saved as failed (never trained on)"
            elif request.command == Record.Request.DISCARD:
                path = self.recorder.discard()
                response.ok, response.message = True, f"discarded {path}" if path else "nothing to discard"
            else:
                response.ok, response.message = False, f"unknown Record command {request.command}"
        except (ValueError, RuntimeError) as exc:
            response.ok, response.message = False, str(exc)
        return response

    def _on_evaluate(self, request, response):
        try:
            model, _ = self.models.newest_for(self.robot_id)
            episodes = int(request.episodes) or self.params["eval_episodes"]
            rates = self.evaluate_model(model, episodes, int(request.seed))
            response.ok, response.message = True, f"{episodes} episode(s) per task"
            response.tasks = list(rates)
            response.success_rates = [float(v) for v in rates.values()]
            response.mean_success_rate = float(np.mean(list(rates.values())))
        except (ValueError, RuntimeError, TimeoutError) as exc:
            response.ok, response.message = False, str(exc)
        return response

    def destroy_node(self) -> None:
        """Stop the worker, the bulk server and the recorder."""
        # Defensive: also called by rclpy's context clean-up after a failed constructor.
        if getattr(self, "_stop", None) is not None:
            self._stop.set()
            self._worker.join(timeout=2.0)
        if getattr(self, "_bulk", None) is not None:
            self._bulk.close()
        if getattr(self, "recorder", None) is not None:
            self.recorder.destroy()
        if getattr(self, "_transfer_log", None) is not None:
            self._transfer_log.close()
        super().destroy_node()



def wait_for_subscribers(node, pub, what: str, timeout: float = 30.0, all_matched_grace_s: float = 3.0) -> None:
    """Block until ``pub`` can deliver: matched by at least one subscription and, preferably, by
    every subscription the ROS graph lists on its topic.

    "count > 0" alone is not enough after a server restart: a SIGKILLed server's subscription
    stays listed (and matched) until its DDS lease expires, and the new one shows up in the graph
    a moment before our writer matches it, so a fast answer would reach only the dead server.
    A listed subscription that never matches (incompatible QoS, e.g. a monitoring tool) is
    waited for ``all_matched_grace_s`` only. Raises TimeoutError naming ``what`` when nobody
    matches within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    some_matched_since = None
    while True:
        matched = pub.get_subscription_count()
        if matched > 0:
            some_matched_since = some_matched_since or time.monotonic()
            if (node.count_subscribers(pub.topic_name) <= matched
                    or time.monotonic() - some_matched_since >= all_matched_grace_s):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody subscribes to {what} after {timeout:.0f} s")
        time.sleep(0.05)

def main(args: list[str] | None = None) -> int:
    """Run the robot node until Ctrl-C (or a failed start-up)."""
    rclpy.init(args=args)
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
        while rclpy.ok() and not node.failed:
            executor.spin_once(timeout_sec=0.1)
        if node.failed:
            node.get_logger().fatal(node.failed)
            code = 1
    except (KeyboardInterrupt, ExternalShutdownException):
        code = 0
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())

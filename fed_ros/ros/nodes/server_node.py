"""The fleet server node: registration, rounds, aggregation, persistence, model publishing.

A thin ROS shell around :class:`fed_ros.core.rounds.RoundCoordinator` (all decisions
live there and are unit-tested without ROS). Interfaces, in the server namespace
(``/fleet``):

    register        fed_ros/srv/Register          robots join (and re-join after a restart)
    round           fed_ros/msg/RoundAnnouncement RELIABLE + TRANSIENT_LOCAL, depth 1
    cluster_models  fed_ros/msg/ClusterModel      RELIABLE + TRANSIENT_LOCAL (late joiners)
    updates         fed_ros/msg/ModelUpdate       robots -> server, chunked or bulk (zmq)
    update_resend   std_msgs/String               server -> robots: missing update chunks
    model_resend    std_msgs/String               robots -> server: missing model chunks
    descriptors     fed_ros/msg/ClientDescriptor  robots -> server (DESCRIBE / SCORE stages)
    robot_metrics   fed_ros/msg/RobotMetrics      robots -> server (EVALUATE stage)
    round_report    fed_ros/msg/RoundReport       RELIABLE + TRANSIENT_LOCAL, last 16 (fed-ros status)

Order after a round (commit point): aggregate -> ModelStore.commit -> publish models ->
report -> next announcement. Killed at any point, the server restarts from the last
committed round with the same models. Parameters: config/server.yaml.
"""
from __future__ import annotations

import inspect
import math
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String

from fed_ros.core.params import manifest_of
from fed_ros.core.store import ModelStore
from fed_ros.core.strategy import STRATEGIES, ClientUpdate, make_strategy
from fed_ros.core.validation import (AuditLog, Decision, Limits, UpdateEnvelope, ValidationContext,
                                     check_update_envelope, validate_descriptor, validate_update)
from fed_ros.msg import (ClientDescriptor as DescriptorMsg, ClusterMetrics, ClusterModel, ModelUpdate,
                         RobotMetrics, RoundAnnouncement, RoundReport)
from fed_ros.ros.wire import qos
from fed_ros.ros.wire.conversions import (Announcement, announcement_to_msg, cluster_model_msg, descriptor_from_msg,
                                     encode_state_dict)
from fed_ros.ros.fleet.plan import SERVER_DEFAULTS, validate_server_params
from fed_ros.core.rounds import (DONE, RoundCoordinator, RoundOutcome, RoundPlan, RoundSettings, Verdict,
                                  ready_to_start)
from fed_ros.ros.wire.transport import (BULK_THRESHOLD_BYTES, BulkServer, ChunkedSender, PayloadAssembler,
                                   PayloadRejected, TransferLimits, decode_resend_request,
                                   encode_resend_request, fetch_bulk)
from fed_ros.srv import Register

# Parameters rclpy declares on every node; not ours to validate.
_ROS_BUILTIN_PARAMS = {"use_sim_time", "start_type_description_service"}
# Depth of the latched cluster-model topic: every chunk of every cluster's current model
# must fit (robots keep the newest round per cluster and ignore older samples).
MODEL_TOPIC_DEPTH = 64
# Round reports a late reader (fed-ros status, the demo) receives on connecting.
REPORT_HISTORY = 16


def strategy_settings(algorithm: str, params: dict[str, Any]) -> dict[str, Any]:
    """make_strategy keyword settings: ``strategy.*`` parameters, plus num_clusters if accepted."""
    settings = {k[len("strategy."):]: v for k, v in params.items() if k.startswith("strategy.")}
    module_name, cls_name = STRATEGIES[algorithm].split(":")
    cls = getattr(__import__(module_name, fromlist=[cls_name]), cls_name)
    accepted = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass is not object:
            accepted |= {p for p, v in inspect.signature(vars(klass)["__init__"]).parameters.items()
                         if v.kind == inspect.Parameter.KEYWORD_ONLY}
    for key in ("num_clusters", "C"):
        if key in accepted and key not in settings:
            settings[key] = params["num_clusters"]
            break
    return settings


def _code_for(reason: str) -> str:
    for key, code in (("late", "late"), ("stale base", "stale_base"), ("stale", "stale_round"),
                      ("future", "future_round"), ("duplicate", "duplicate"),
                      ("not a participant", "not_participant"), ("NaN", "non_finite"),
                      ("tensor", "schema"), ("no training round", "no_round")):
        if key in reason:
            return code
    return "rejected"


class FleetServer(Node):
    """Fleet server: a thin shell that turns messages into RoundCoordinator calls."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("server", allow_undeclared_parameters=True,
                         automatically_declare_parameters_from_overrides=True, **kwargs)
        for name, default in SERVER_DEFAULTS.items():
            if not self.has_parameter(name):
                self.declare_parameter(name, default)
        names = self.list_parameters([], 0).names
        raw = {n: self.get_parameter(n).value for n in names if n not in _ROS_BUILTIN_PARAMS}
        self.params = p = validate_server_params(raw)  # ValueError names the bad parameter

        from fed_ros.learning.configuration_policy import PolicyConfig
        from fed_ros.learning.trainer import initial_state_dict

        self.strategy = make_strategy(p["algorithm"], **strategy_settings(p["algorithm"], p))
        initial = initial_state_dict(PolicyConfig(kind=p["policy"]), seed=p["seed"])
        self.manifest = manifest_of(initial)
        state_dir = Path(p["state_dir"])
        self.store = ModelStore(state_dir)
        self.audit = AuditLog(state_dir / "audit.jsonl")
        self.allow_list = None
        allowed_keys = None
        if p["allowed_keys_file"]:
            from fed_ros.core.auth import AllowList, ReplayGuard
            self.allow_list = AllowList.from_yaml(p["allowed_keys_file"])
            allowed_keys = {rid: self.allow_list.public_key(rid) for rid in self.allow_list.robot_ids}
            self.replay_guard = ReplayGuard()
        elif p["require_signatures"]:
            raise ValueError("server parameter 'require_signatures' is true but 'allowed_keys_file' is empty")
        else:
            self.replay_guard = None
        self.signer = None
        if p["private_key_file"]:
            from fed_ros.core.auth import Signer
            self.signer = Signer.from_file(p["private_key_file"])
        from fed_ros.core.rounds import Roster
        settings = RoundSettings(
            algorithm=p["algorithm"], rounds=p["rounds"], quorum_fraction=p["quorum_fraction"],
            min_quorum=p["min_quorum"], round_timeout_s=p["round_timeout_s"], max_attempts=p["max_attempts"],
            max_samples=p["max_samples"], evaluate_every=p["evaluate_every"], eval_timeout_s=p["eval_timeout_s"],
            eval_episodes=p["eval_episodes"])
        self.coord = RoundCoordinator(self.strategy, self.store, settings, initial,
                                      Roster(allowed_keys=allowed_keys, max_samples=p["max_samples"]),
                                      clock=self._now)
        self.resumed = self.coord.resume()
        self.limits = TransferLimits(max_total_bytes=p["max_update_bytes"])
        self.assembler = PayloadAssembler(self.limits, max_pending=16)
        self._bulk: BulkServer | None = None
        self._fetches = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fed_ros-fetch")
        self._fetched: queue.Queue = queue.Queue()
        self._envelopes: dict[str, tuple[UpdateEnvelope, dict[str, float], float]] = {}
        self._closed_payloads: set[str] = set()
        self._model_senders: dict[str, ChunkedSender] = {}
        self._model_signatures: dict[str, bytes] = {}
        self._published_models_round = -1
        self._started = False
        self._start_time = time.monotonic()
        self.exit_code: int | None = None
        self.updates_completed = 0

        group = MutuallyExclusiveCallbackGroup()  # every callback that touches round state
        self.announce_pub = self.create_publisher(RoundAnnouncement, "round", qos.latched_qos())
        self.model_pub = self.create_publisher(ClusterModel, "cluster_models", qos.model_state_qos(MODEL_TOPIC_DEPTH))
        # Reports keep a history: with KEEP_LAST(1) a report published right after another
        # can replace it before a reader acknowledged it (reliable + keep-last drops).
        self.report_pub = self.create_publisher(RoundReport, "round_report", qos.model_state_qos(REPORT_HISTORY))
        self.resend_pub = self.create_publisher(String, "update_resend", qos.control_qos())
        self.create_subscription(ModelUpdate, "updates", self._on_update, qos.control_qos(), callback_group=group)
        self.create_subscription(DescriptorMsg, "descriptors", self._on_descriptor, qos.control_qos(),
                                 callback_group=group)
        self.create_subscription(RobotMetrics, "robot_metrics", self._on_metrics, qos.control_qos(),
                                 callback_group=group)
        self.create_subscription(String, "model_resend", self._on_model_resend, qos.control_qos(),
                                 callback_group=group)
        self.create_service(Register, "register", self._on_register, callback_group=group)
        self.create_timer(0.1, self._tick, callback_group=group)
        where = (f"resumed after committed round {self.coord.round_idx - 1}" if self.resumed
                 else "no committed round: starting from the initial model")
        self.get_logger().info(
            f"fleet server: {p['algorithm']} x {p['rounds']} rounds, store {state_dir} ({where}); "
            f"waiting for robots {p['expected_robots'] or ('>= ' + str(p['min_robots']))}")

    # ------------------------------------------------------------------ helpers
    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _validation_ctx(self) -> ValidationContext:
        plan = self.coord.current_plan
        round_idx = plan.round_idx if plan else self.coord.round_idx
        return ValidationContext(
            current_round=round_idx, expected_manifest=self.manifest, base_rounds={round_idx},
            participants=set(plan.participants) if plan else set(),
            deadline_passed=bool(plan and self._now() > plan.deadline_s),
            limits=Limits(max_update_bytes=self.params["max_update_bytes"],
                          max_num_samples=max(self.params["max_samples"], 1) * 10),
            allow_list=self.allow_list, replay_guard=self.replay_guard)

    def _reject_update(self, pid: str, robot_id: str, round_idx: int, reason: str, code: str = "",
                       **extra: Any) -> None:
        self._closed_payloads.add(pid)
        self._envelopes.pop(pid, None)
        self.assembler.discard(pid)
        self.coord.record_rejection(robot_id, reason)
        self.audit.record(kind="update", robot_id=robot_id, round_idx=round_idx,
                          decision=Decision(False, code or _code_for(reason), reason), payload_id=pid, **extra)
        self.get_logger().warning(f"update {pid} rejected: {reason}")

    # ------------------------------------------------------------------ registration
    def _on_register(self, request, response):
        verdict = self.coord.roster.register(
            request.robot_id, tasks=list(request.tasks), num_samples=int(request.num_samples),
            has_gpu=bool(request.has_gpu), public_key=bytes(request.public_key),
            action_dim=int(request.action_dim) if request.action_dim else None)
        response.accepted = verdict.accepted
        response.reason = verdict.reason
        response.current_round = int(self.coord.round_idx)
        membership = self.coord.memberships.get(request.robot_id, [])
        response.cluster_ids = [int(c) for c, _ in membership]
        response.weights = [float(w) for _, w in membership]
        log = self.get_logger().info if verdict.accepted else self.get_logger().warning
        log(f"register {request.robot_id!r}: {'accepted' if verdict.accepted else verdict.reason} "
            f"({len(self.coord.roster)} robots)")
        return response

    def _ready_to_start(self) -> bool:
        p = self.params
        return ready_to_start(registered=self.coord.roster.ids, expected=p["expected_robots"],
                              min_robots=p["min_robots"], waited_s=time.monotonic() - self._start_time,
                              registration_timeout_s=p["registration_timeout_s"], resumed=self.resumed)

    # ------------------------------------------------------------------ main loop
    def _tick(self) -> None:
        if self.exit_code is not None:
            return
        try:
            self._drain_fetches()
            if not self._started:
                if not self._ready_to_start():
                    return
                self._started = True
                plan = self.coord.start_round()
                self._publish_plan(plan, None)
                return
            plan, outcome = self.coord.poll()
            if plan is not None or outcome is not None:
                self._publish_plan(plan, outcome)
            for pid, missing in self.assembler.stalled().items():
                if missing:
                    self.resend_pub.publish(String(data=encode_resend_request(pid, missing)))
            if self.coord.failed_reason:
                self.get_logger().error(f"giving up: {self.coord.failed_reason}")
                self.exit_code = 1
            elif self.coord.finished and self.coord.collector is None and self.params["exit_when_done"]:
                self.exit_code = 0
        except Exception as exc:  # noqa: BLE001 - e.g. the store failed: stop, restart resumes
            import traceback
            self.get_logger().fatal(f"server failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            self.exit_code = 3

    def _publish_plan(self, plan: RoundPlan | None, outcome: RoundOutcome | None) -> None:
        """Models (when they changed), then the report, then the announcement."""
        if self.coord.round_idx != self._published_models_round:
            self._publish_models()
        if outcome is not None:
            self.report_pub.publish(self._report_msg(outcome))
            self.get_logger().info(f"round {outcome.round_idx}: {outcome.status} "
                                   f"({outcome.updates_accepted}/{len(outcome.robots)} updates)")
        if plan is not None:
            ann = Announcement(round_idx=plan.round_idx, stage=plan.stage, deadline_s=plan.deadline_s,
                               algorithm=plan.algorithm, participants=plan.participants,
                               memberships=plan.memberships, quorum=plan.quorum, configs=plan.configs)
            self._forget_stale_payloads(plan.round_idx)
            msg = announcement_to_msg(ann)
            msg.header.stamp = self.get_clock().now().to_msg()
            self.announce_pub.publish(msg)
            if self.replay_guard is not None:
                self.replay_guard.advance(plan.round_idx)
            self.get_logger().info(f"announced round {plan.round_idx} stage {plan.stage} to "
                                   f"{len(plan.participants)} robots (quorum {plan.quorum})")
            if plan.stage == DONE:
                self.get_logger().info("federation finished: robots keep their cluster models")

    def _forget_stale_payloads(self, round_idx: int) -> None:
        """Free partial updates of closed rounds (a robot died mid-upload); bound the closed-id memory."""
        for pid, (env, _, _) in list(self._envelopes.items()):
            if env.round_idx < round_idx:
                self._envelopes.pop(pid, None)
                self.assembler.discard(pid)
                self._closed_payloads.add(pid)
        if len(self._closed_payloads) > 100_000:
            self._closed_payloads.clear()  # ids of old rounds: their rounds are stale anyway

    def _publish_models(self) -> None:
        round_idx = self.coord.round_idx
        members: dict[int, list[str]] = {}
        for rid, membership in self.coord.memberships.items():
            for cid, weight in membership:
                if weight > 0:
                    members.setdefault(int(cid), []).append(rid)
        if self._bulk is not None:
            for sender in self._model_senders.values():
                if sender.bulk_uri:
                    self._bulk.withdraw(sender.bulk_uri)
        self._model_senders.clear()
        stamp = self.get_clock().now().to_msg()
        for cid, model in sorted(self.coord.cluster_models.items()):
            encoded = encode_state_dict(model)
            pid = f"cluster_{cid}/r{round_idx}/{encoded.sha256[:12]}"
            uri = ""
            channel = self.params["transfer_channel"]
            if channel == "zmq" or (channel == "auto" and encoded.total_bytes >= BULK_THRESHOLD_BYTES):
                if self._bulk is None:
                    self._bulk = BulkServer(ttl_s=7 * 24 * 3600.0)  # the current models stay fetchable
                uri = self._bulk.offer(encoded.data)
            sender = ChunkedSender(encoded, pid, bulk_uri=uri)
            self._model_senders[pid] = sender
            signature = (self.signer.sign_cluster_model(round_idx, cid, encoded.sha256)
                         if self.signer is not None else b"")
            self._model_signatures[pid] = signature
            for chunk in sender.chunks():
                self.model_pub.publish(cluster_model_msg(chunk, cluster_id=cid, round_idx=round_idx,
                                                         member_robot_ids=sorted(members.get(cid, [])),
                                                         signature=signature, stamp=stamp))
        self._published_models_round = round_idx
        self.get_logger().info(f"published {len(self.coord.cluster_models)} cluster model(s) for round {round_idx}")

    def _report_msg(self, outcome: RoundOutcome) -> RoundReport:
        msg = RoundReport(round=outcome.round_idx, algorithm=outcome.algorithm, completed=outcome.completed,
                          status=outcome.status, updates_received=outcome.updates_received,
                          updates_accepted=outcome.updates_accepted, updates_rejected=outcome.updates_rejected,
                          aggregation_seconds=float(outcome.aggregation_seconds))
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.robots = [RobotMetrics(robot_id=r.robot_id, cluster_ids=r.cluster_ids, num_samples=r.num_samples,
                                   train_loss=r.train_loss, val_loss=r.val_loss, success_rate=r.success_rate,
                                   accepted=r.accepted, reason=r.reason) for r in outcome.robots]
        msg.clusters = [ClusterMetrics(cluster_id=cid, member_robot_ids=members,
                                       update_norm=float(outcome.cluster_update_norms.get(cid, math.nan)),
                                       intra_similarity=float(outcome.cluster_intra_similarity.get(cid, math.nan)))
                        for cid, members in sorted(outcome.clusters.items())]
        names = sorted(outcome.diagnostics)
        msg.diagnostic_names = names
        msg.diagnostic_values = [float(outcome.diagnostics[n]) for n in names]
        return msg

    # ------------------------------------------------------------------ updates
    def _on_update(self, msg) -> None:
        payload = msg.payload
        pid = payload.payload_id
        if pid in self._closed_payloads:
            return
        rid, round_idx = str(msg.robot_id), int(msg.round)
        if pid not in self._envelopes:
            env = UpdateEnvelope(robot_id=rid, round_idx=round_idx, base_round=int(msg.base_round),
                                 num_samples=int(msg.num_samples), manifest=list(payload.manifest),
                                 total_bytes=int(payload.total_bytes), payload_sha256=payload.sha256,
                                 encoding=int(payload.encoding), cluster_id=int(msg.cluster_id),
                                 nonce=bytes(msg.nonce), signature=bytes(msg.signature))
            # Cheap checks on the first chunk, before any payload byte is collected (V1, V2).
            verdict = self.coord.check_update(rid, round_idx, int(msg.base_round))
            if not verdict.accepted:
                return self._reject_update(pid, rid, round_idx, verdict.reason)
            decision = check_update_envelope(env, self._validation_ctx())
            if not decision:
                return self._reject_update(pid, rid, round_idx, decision.reason, decision.code)
            metrics = {"train_loss": float(msg.train_loss), "val_loss": float(msg.val_loss)}
            self._envelopes[pid] = (env, metrics, time.monotonic())
            if payload.bulk_uri:
                self._fetches.submit(self._fetch, pid, payload)
                return
        if payload.bulk_uri:
            return  # a repeated control message of a fetch in progress
        try:
            complete = self.assembler.add(payload)
        except PayloadRejected as exc:
            return self._reject_update(pid, rid, round_idx, str(exc), "malformed")
        if complete is not None:
            self._complete_update(pid, complete.state_dict(copy=True), complete.sha256, complete.data.nbytes)

    def _fetch(self, pid: str, payload) -> None:
        """Worker thread: pull bulk bytes; the result is handled on the node's callback group."""
        try:
            data = fetch_bulk(payload, limits=self.limits)
            self._fetched.put((pid, payload, data, None))
        except Exception as exc:  # noqa: BLE001 - any failure rejects this update only
            self._fetched.put((pid, payload, None, f"bulk fetch failed: {exc}"))

    def _drain_fetches(self) -> None:
        from fed_ros.ros.wire.conversions import decode_state_dict, manifest_from_msgs
        while True:
            try:
                pid, payload, data, error = self._fetched.get_nowait()
            except queue.Empty:
                return
            env = self._envelopes.get(pid)
            if env is None:
                continue
            if error is not None:
                self._reject_update(pid, env[0].robot_id, env[0].round_idx, error, "malformed")
                continue
            params = decode_state_dict(manifest_from_msgs(payload.manifest), int(payload.encoding), data,
                                       np.asarray(payload.scales, np.float32), copy=True)
            self._complete_update(pid, params, payload.sha256, int(data.nbytes))

    def _complete_update(self, pid: str, params: dict, sha256: str, nbytes: int) -> None:
        env, metrics, _ = self._envelopes.pop(pid)
        self._closed_payloads.add(pid)
        rid, round_idx = env.robot_id, env.round_idx
        decision = validate_update(env, params, self._validation_ctx(), received_sha256=sha256)
        if not decision:
            return self._reject_update(pid, rid, round_idx, decision.reason, decision.code, sha256=sha256,
                                       bytes=nbytes)
        update = ClientUpdate(robot_id=rid, params=params, num_samples=int(env.num_samples),
                              base_round=int(env.base_round), cluster_id=int(env.cluster_id), metrics=metrics)
        update.round_idx = round_idx
        verdict: Verdict = self.coord.offer_update(update)
        self.audit.record(kind="update", robot_id=rid, round_idx=round_idx,
                          decision=Decision(verdict.accepted, "ok" if verdict.accepted else _code_for(verdict.reason),
                                            verdict.reason or "accepted"),
                          payload_id=pid, sha256=sha256, bytes=nbytes)
        if verdict.accepted:
            self.updates_completed += 1
            self.get_logger().info(f"update from {rid} for round {round_idx} accepted ({nbytes} B, {sha256[:12]})")
        else:
            self.get_logger().warning(f"update {pid} rejected: {verdict.reason}")

    def _on_model_resend(self, msg) -> None:
        try:
            pid, chunks = decode_resend_request(msg.data)
        except ValueError as exc:
            self.get_logger().warning(f"bad model resend request: {exc}")
            return
        sender = self._model_senders.get(pid)
        if sender is None:
            return  # an old round's model: the robot will get the current one
        cid = int(pid.split("/")[0].split("_")[1])
        members = sorted(r for r, m in self.coord.memberships.items() if any(c == cid and w > 0 for c, w in m))
        try:
            for chunk in sender.resend(chunks):
                self.model_pub.publish(cluster_model_msg(chunk, cluster_id=cid, round_idx=self.coord.round_idx,
                                                         member_robot_ids=members,
                                                         signature=self._model_signatures.get(pid, b"")))
        except ValueError as exc:
            self.get_logger().warning(f"bad model resend request for {pid}: {exc}")

    # ------------------------------------------------------------------ descriptors / metrics
    def _on_descriptor(self, msg) -> None:
        rid = str(msg.robot_id)
        try:
            desc = descriptor_from_msg(msg)
        except ValueError as exc:
            self.coord.record_rejection(rid, str(exc))
            self.audit.record(kind="descriptor", robot_id=rid, round_idx=int(msg.round),
                              decision=Decision(False, "bad_descriptor", str(exc)))
            return
        decision = validate_descriptor(desc, self._validation_ctx(), round_idx=int(msg.round),
                                       nonce=bytes(msg.nonce), signature=bytes(msg.signature), dims=int(msg.dims))
        if not decision:
            self.coord.record_rejection(rid, decision.reason)
            self.audit.record(kind="descriptor", robot_id=rid, round_idx=int(msg.round), decision=decision)
            self.get_logger().warning(f"descriptor from {rid} rejected: {decision.reason}")
            return
        verdict = self.coord.offer_descriptor(desc, int(msg.round))
        self.audit.record(kind="descriptor", robot_id=rid, round_idx=int(msg.round),
                          decision=Decision(verdict.accepted, "ok" if verdict.accepted else _code_for(verdict.reason),
                                            verdict.reason or "accepted"))

    def _on_metrics(self, msg) -> None:
        verdict = self.coord.offer_metrics(str(msg.robot_id), float(msg.success_rate))
        if not verdict.accepted:
            self.get_logger().warning(f"metrics from {msg.robot_id}: {verdict.reason}")

    def destroy_node(self) -> None:
        """Stop the fetch workers and the bulk server, close the audit log."""
        # Defensive: also called by rclpy's context clean-up after a failed constructor.
        if getattr(self, "_fetches", None) is not None:
            self._fetches.shutdown(wait=False, cancel_futures=True)
        if getattr(self, "_bulk", None) is not None:
            self._bulk.close()
        if getattr(self, "audit", None) is not None:
            self.audit.close()
        super().destroy_node()


def main(args: list[str] | None = None) -> int:
    """Run the fleet server until Ctrl-C, failure, or (exit_when_done) the last round."""
    rclpy.init(args=args)
    node = None
    code = 0
    try:
        try:
            node = FleetServer()
        except ValueError as exc:
            print(f"fed_ros server: invalid configuration: {exc}", file=sys.stderr)
            return 2
        executor = MultiThreadedExecutor(num_threads=3)
        executor.add_node(node)
        while rclpy.ok() and node.exit_code is None:
            executor.spin_once(timeout_sec=0.1)
        code = node.exit_code or 0
    except (KeyboardInterrupt, ExternalShutdownException):
        code = 0
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The fleet server node: registration, rounds, aggregation, persistence, model publishing.

A thin ROS shell around :class:`fed_ros.core.rounds.coordinator.RoundCoordinator` (all decisions
live there and are unit-tested without ROS). Interfaces, in the server namespace
(``/fleet``):

    register        fed_ros/srv/Register          robots join (and re-join after a restart)
    round           fed_ros/msg/RoundAnnouncement RELIABLE + TRANSIENT_LOCAL, depth 1
    cluster_models  fed_ros/msg/ClusterModel      RELIABLE + TRANSIENT_LOCAL (late joiners)
    updates         fed_ros/msg/ModelUpdate       robots -> server, chunked or bulk (zmq)
    update_resend   std_msgs/String               server -> robots: missing update chunks
    model_resend    std_msgs/String               robots -> server: missing model chunks
    descriptors     fed_ros/msg/ClientDescriptor  robots -> server (DESCRIBE / SCORE stages)
    robot_metrics   fed_ros/msg/RobotMetrics      robots -> server (EVALUATE; accepted false: sits a stage out, why)
    round_report    fed_ros/msg/RoundReport       RELIABLE + TRANSIENT_LOCAL, last 16 (fed-ros status)
    server/set_rounds  std_srvs/SetBool  pause new rounds (rounds_enabled); server/end_fleet (Trigger): end

Order after a round (commit point): aggregate -> ModelStore.commit -> publish models ->
report -> next announcement. Killed at any point, the server restarts from the last
committed round with the same models. Parameters: config/server.yaml.
"""
from __future__ import annotations

import dataclasses
import inspect
import sys
import time
from pathlib import Path
from typing import Any

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String

from fed_ros.core.params import manifest_of
from fed_ros.core.rounds.store import ModelStore
from fed_ros.core.strategies.base import STRATEGIES, make_strategy
from fed_ros.core.checks.decisions import ACCEPTED, Decision, REGISTER
from fed_ros.core.checks.audit_log import AuditLog
from fed_ros.core.checks.descriptor_checks import validate_descriptor
from fed_ros.msg import (ClientDescriptor as DescriptorMsg, ClusterModel, ModelUpdate,
                         RobotMetrics, RoundAnnouncement, RoundReport, UpdateAck)
from fed_ros.ros import shutdown
from fed_ros.ros.wire import diagnostics, qos
from fed_ros.ros.wire.round_msgs import (Announcement, announcement_to_msg, cluster_model_msg,
                                         descriptor_from_msg)
from fed_ros.ros.wire.tensors import encode_state_dict
from fed_ros.ros.wire.round_msgs import round_report_to_msg
from fed_ros.ros.fleet.params import ServerParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.core.rounds.roster import ready_to_start
from fed_ros.core.rounds.collect import DONE, RoundPlan
from fed_ros.core.rounds.report import RoundOutcome
from fed_ros.core.rounds.coordinator import RoundCoordinator, RoundSettings
from fed_ros.ros.wire.transfer import TransferReceiver, TransferSender
from fed_ros.ros.wire.chunk_assembler import TransferLimits
from fed_ros.srv import Register
from fed_ros.core.checks import bounds
from fed_ros.core.rounds import faults
from fed_ros.ros.nodes.handler_guard import HandlerGuard
from fed_ros.ros.nodes.rounds_gate import RoundsGate
from fed_ros.ros.nodes.server_updates import UpdateIntake
from fed_ros.ros.wire.signed import sign_json, sign_msg, verify_json

# Depth of the latched cluster-model topic: every chunk of every cluster's current model
# must fit (robots keep the newest round per cluster and ignore older samples).
MODEL_TOPIC_DEPTH = 64
# Samples the updates reader queues (KEEP_LAST): bounds the server's memory under a flood.
# Measured (hostile suite, 300 updates with 1 MB ids): KEEP_ALL +367 MiB, KEEP_LAST(8) +18 MiB.
UPDATES_INBOX_DEPTH = 8
# Round reports a late reader (fed-ros status, the demo) receives on connecting.
REPORT_HISTORY = 16


def strategy_settings(algorithm: str, params: ServerParams) -> dict[str, Any]:
    """make_strategy keyword settings: ``strategy.*`` parameters, plus num_clusters if accepted."""
    settings = {k[len("strategy."):]: v for k, v in params.extra.items() if k.startswith("strategy.")}
    module_name, cls_name = STRATEGIES[algorithm].split(":")
    cls = getattr(__import__(module_name, fromlist=[cls_name]), cls_name)
    accepted = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass is not object:
            accepted |= {p for p, v in inspect.signature(vars(klass)["__init__"]).parameters.items()
                         if v.kind == inspect.Parameter.KEYWORD_ONLY}
    for key in ("num_clusters", "C"):
        if key in accepted and key not in settings:
            settings[key] = params.num_clusters
            break
    return settings


class FleetServer(Node):
    """Fleet server: a thin shell that turns messages into RoundCoordinator calls."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("server", **kwargs)
        # Typed, described parameters (ServerParams; ValueError names a bad one); a live
        # `ros2 param set` is applied (round timing, evaluation, exit_when_done) or refused.
        self.params = p = declare_typed_parameters(self, ServerParams, self._on_params_changed)

        from fed_ros.learning.configuration_policy import PolicyConfig
        from fed_ros.learning.trainer import initial_state_dict

        self.strategy = make_strategy(p.algorithm, **strategy_settings(p.algorithm, p))
        initial = initial_state_dict(PolicyConfig(kind=p.policy), seed=p.seed)
        self.manifest = manifest_of(initial)
        state_dir = Path(p.state_dir)
        self.store = ModelStore(state_dir, _crash_point=faults.store_hook(lambda: self.coord.round_idx))  # tests
        self.audit = AuditLog(state_dir / "audit.jsonl")
        self.allow_list = None
        allowed_keys = None
        if p.allowed_keys_file:
            from fed_ros.core.security.auth import AllowList
            from fed_ros.core.security.replay import ReplayGuard
            self.allow_list = AllowList.from_yaml(p.allowed_keys_file)
            allowed_keys = {rid: self.allow_list.public_key(rid) for rid in self.allow_list.robot_ids}
            self.replay_guard = ReplayGuard()
        else:  # (ServerParams refuses require_signatures without allowed_keys_file)
            self.replay_guard = None
        self.signer = None
        if p.private_key_file:
            from fed_ros.core.security.auth import Signer
            self.signer = Signer.from_file(p.private_key_file)
        # With require_signatures a Register must prove possession of the allow-listed key
        # (signature over its claim + timestamp + nonce); without it only the key must match.
        self.registration_guard = None
        if p.require_signatures and self.allow_list is not None:
            from fed_ros.core.security.registration import RegistrationGuard
            self.registration_guard = RegistrationGuard(self.allow_list)
        from fed_ros.core.rounds.roster import Roster
        settings = RoundSettings(
            algorithm=p.algorithm, rounds=p.rounds, quorum_fraction=p.quorum_fraction,
            min_quorum=p.min_quorum, round_timeout_s=p.round_timeout_s, max_attempts=p.max_attempts,
            max_samples=p.max_samples, evaluate_every=p.evaluate_every, eval_timeout_s=p.eval_timeout_s,
            eval_episodes=p.eval_episodes)
        self.coord = RoundCoordinator(self.strategy, self.store, settings, initial,
                                      Roster(allowed_keys=allowed_keys, max_samples=p.max_samples),
                                      clock=self._now, roster_file=Path(p.state_dir) / "roster.json")
        self.resumed = self.coord.resume()
        self.limits = TransferLimits(max_total_bytes=p.max_update_bytes)
        # Transfer: updates in (assembly, bulk fetch, the one payload check), cluster models out.
        self.updates_in = TransferReceiver(self.manifest, self.limits, max_pending=16,
                                           on_event=shutdown.unless_stopping(lambda text: self.get_logger().warning(text)))
        self.models_out = TransferSender(p.transfer_channel, bulk_threshold_bytes=p.bulk_threshold_bytes,
                                         bulk_ttl_s=7 * 24 * 3600.0)  # the current models stay fetchable
        # Updates: checks, assembly, one decision per payload id, acknowledgements.
        self.intake = UpdateIntake(
            coord=self.coord, updates_in=self.updates_in, audit=self.audit,
            publish_ack=lambda msg: self.ack_pub.publish(msg), manifest=self.manifest,
            allow_list=self.allow_list, replay_guard=self.replay_guard, params=lambda: self.params,
            now=self._now, now_msg=lambda: self.get_clock().now().to_msg(), log=self.get_logger())
        self._resend_limit = bounds.RateLimiter(per_s=10.0, burst=20)
        self.resend_refused = 0  # model_resend requests refused: unsigned, forged or over the rate limit
        self._published_models_round = -1
        self._started = False
        self._start_time = time.monotonic()
        self.exit_code: int | None = None

        group = MutuallyExclusiveCallbackGroup()  # every callback that touches round state
        self.announce_pub = self.create_publisher(RoundAnnouncement, "round", qos.latched_qos())
        self.model_pub = self.create_publisher(ClusterModel, "cluster_models", qos.model_state_qos(MODEL_TOPIC_DEPTH))
        # Reports keep a history: with KEEP_LAST(1) a report published right after another
        # can replace it before a reader acknowledged it (reliable + keep-last drops).
        self.report_pub = self.create_publisher(RoundReport, "round_report", qos.model_state_qos(REPORT_HISTORY))
        self.resend_pub = self.create_publisher(String, "update_resend", qos.control_qos())
        self.ack_pub = self.create_publisher(UpdateAck, "update_acks", qos.control_qos())
        # No handler can crash the node: a failing callback is logged with its type, counted
        # (guard.failures) and audited; the node keeps serving.
        self.guard = guard = HandlerGuard(self, on_error=self._audit_handler_failure)
        # Anyone on the domain can write here: KEEP_LAST bounds what DDS queues for us (qos.inbox_qos).
        self.create_subscription(ModelUpdate, "updates", guard.wrap("updates", self.intake.on_update),
                                 qos.inbox_qos(UPDATES_INBOX_DEPTH), callback_group=group)
        self.create_subscription(DescriptorMsg, "descriptors", guard.wrap("descriptors", self._on_descriptor),
                                 qos.control_qos(), callback_group=group)
        self.create_subscription(RobotMetrics, "robot_metrics", guard.wrap("robot_metrics", self._on_metrics),
                                 qos.control_qos(), callback_group=group)
        self.create_subscription(String, "model_resend", guard.wrap("model_resend", self._on_model_resend),
                                 qos.control_qos(), callback_group=group)
        self.create_service(Register, "register", guard.wrap("register", self._on_register, self._register_failed),
                            callback_group=group)
        self.create_timer(0.1, self._tick, callback_group=group)
        self.rounds_gate = RoundsGate(self, p.rounds_enabled, callback_group=group)  # ~/set_rounds, ~/end_fleet
        diagnostics.attach(self, "server", callback_group=group)  # /diagnostics, 1 Hz
        where = (f"resumed after committed round {self.coord.round_idx - 1}" if self.resumed
                 else "no committed round: starting from the initial model")
        self.get_logger().info(
            f"fleet server: {p.algorithm} x {p.rounds} rounds, store {state_dir} ({where}); "
            f"waiting for robots {p.robots_expected or ('>= ' + str(p.min_robots))}")

    def _on_params_changed(self, params: ServerParams) -> None:
        """A live parameter change (already checked): round timing and evaluation from the next stage on."""
        self.params = params
        self.coord.settings = dataclasses.replace(
            self.coord.settings, round_timeout_s=params.round_timeout_s, evaluate_every=params.evaluate_every,
            eval_timeout_s=params.eval_timeout_s, eval_episodes=params.eval_episodes)
        self.get_logger().info(f"parameters changed live: {self.coord.settings}")

    # ------------------------------------------------------------------ helpers
    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    # ------------------------------------------------------------------ registration
    def _on_register(self, request, response):
        verdict = self._check_register(request)
        if verdict.accepted:
            verdict = self.coord.register(
                request.robot_id, tasks=list(request.tasks), num_samples=int(request.num_samples),
                has_gpu=bool(request.has_gpu), public_key=bytes(request.public_key),
                action_dim=int(request.action_dim) if request.action_dim else None)
        rid = bounds.clip(request.robot_id, 64)
        response.accepted = verdict.accepted
        response.reason = verdict.reason[:bounds.MAX_REASON_CHARS]
        response.current_round = int(self.coord.round_idx)
        membership = self.coord.memberships.get(request.robot_id, []) if verdict.accepted else []
        response.cluster_ids = [int(c) for c, _ in membership]
        response.weights = [float(w) for _, w in membership]
        # One severity per call site: rclpy raises "Logger severity cannot be changed between
        # calls" when one line logs at two severities (a rejected Register killed the server).
        if verdict.accepted:
            self.get_logger().info(f"register {rid!r}: accepted ({len(self.coord.roster)} robots)")
        else:
            self.audit.record(kind="register", robot_id=rid, round_idx=int(self.coord.round_idx), decision=verdict)
            self.get_logger().warning(f"register {rid!r} refused: {verdict.reason[:300]}")
        return response

    def _check_register(self, request) -> Decision:
        """Bounds first (DDS does not enforce the .srv bounds), then the proof of key possession."""
        why = bounds.oversized({"robot_id": (request.robot_id, bounds.MAX_ID_CHARS),
                                "public_key": (request.public_key, bounds.PUBLIC_KEY_BYTES),
                                "nonce": (request.nonce, bounds.NONCE_BYTES),
                                "signature": (request.signature, bounds.SIGNATURE_BYTES)}) \
            or bounds.oversized_items("tasks", request.tasks, bounds.MAX_TASKS, bounds.MAX_NAME_CHARS) \
            or bounds.oversized_items("cameras", request.cameras, bounds.MAX_CAMERAS, bounds.MAX_NAME_CHARS)
        if why is not None:
            return Decision(False, REGISTER, f"register request refused: {why}")
        if self.registration_guard is None:
            return ACCEPTED
        from fed_ros.core.security.registration import RegistrationClaim
        claim = RegistrationClaim(robot_id=request.robot_id, public_key=bytes(request.public_key),
                                  tasks=tuple(request.tasks), cameras=tuple(request.cameras),
                                  action_dim=int(request.action_dim), has_gpu=bool(request.has_gpu),
                                  num_samples=int(request.num_samples))
        why = self.registration_guard.check(claim, int(request.timestamp_ns), bytes(request.nonce),
                                            bytes(request.signature))
        return ACCEPTED if why is None else Decision(False, REGISTER, why)

    def _register_failed(self, args: tuple, exc: BaseException):
        """Service fallback: a Register whose handling raised is refused with the reason."""
        response = args[1]
        response.accepted = False
        response.reason = f"server error ({type(exc).__name__}); registration not recorded"
        return response

    def _audit_handler_failure(self, name: str, exc: BaseException) -> None:
        self.audit.record(kind="handler_error", robot_id="", round_idx=int(self.coord.round_idx),
                          decision=Decision(False, "handler_error", f"{name}: {type(exc).__name__}: {exc}"))

    def _ready_to_start(self) -> bool:
        p = self.params
        return self.coord.end_requested or ready_to_start(  # end_fleet before round 0: STAGE_DONE now
            registered=self.coord.roster.ids, expected=p.robots_expected, min_robots=p.min_robots, resumed=self.resumed,
            waited_s=time.monotonic() - self._start_time, registration_timeout_s=p.registration_timeout_s)

    # ------------------------------------------------------------------ main loop
    def _tick(self) -> None:
        if self.exit_code is not None or shutdown.requested():
            return  # stopping: robots vanish on purpose, their unfinished uploads are no fault
        try:
            for result in self.updates_in.completed():
                self.intake.complete(result)
            self.intake.audit_drops()
            if not self._started:
                if not self._ready_to_start():
                    return
                self._started = self.coord.held = True  # poll announces the round (not while paused)
            plan, outcome = self.coord.poll()
            if plan is not None or outcome is not None:
                self._publish_plan(plan, outcome)
            for request in self.updates_in.resend_requests():
                self.resend_pub.publish(String(data=sign_json(request, "update_resend", self.signer)))
            if self.coord.failed_reason:
                self.get_logger().error(f"giving up: {self.coord.failed_reason}")
                self.exit_code = 1
            elif self.coord.finished and self.coord.collector is None and self.params.exit_when_done:
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
            self.report_pub.publish(round_report_to_msg(outcome, self.get_clock().now().to_msg()))
            self.get_logger().info(f"round {outcome.round_idx}: {outcome.status} ({outcome.updates_accepted}/"
                                   f"{len(outcome.robots)} updates; model resend {self.resend_refused} refused)")  # exact, unthrottled
            self.rounds_gate.after_round(plan)  # logs a round held back by the pause
        if plan is not None:
            ann = Announcement(round_idx=plan.round_idx, stage=plan.stage, deadline_s=plan.deadline_s,
                               algorithm=plan.algorithm, participants=plan.participants,
                               memberships=plan.memberships, quorum=plan.quorum, configs=plan.configs)
            self.intake.forget_stale(plan)
            msg = announcement_to_msg(ann)
            msg.header.stamp = self.get_clock().now().to_msg()
            self.announce_pub.publish(sign_msg(msg, "round", self.signer))  # robots refuse a fake server's
            if self.replay_guard is not None:
                self.replay_guard.advance(plan.round_idx)
            self.get_logger().info(f"announced round {plan.round_idx} stage {plan.stage} to "
                                   f"{len(plan.participants)} robots (quorum {plan.quorum})")
            if plan.stage == DONE:
                self.get_logger().info("federation finished: robots keep their cluster models")

    def _publish_models(self) -> None:
        round_idx = self.coord.round_idx
        members: dict[int, list[str]] = {}
        for rid, membership in self.coord.memberships.items():
            for cid, weight in membership:
                if weight > 0:
                    members.setdefault(int(cid), []).append(rid)
        self.models_out.withdraw_all()  # the previous round's models stop being served
        stamp = self.get_clock().now().to_msg()
        for cid, model in sorted(self.coord.cluster_models.items()):
            encoded = encode_state_dict(model)
            out = self.models_out.prepare(encoded, f"cluster_{cid}/r{round_idx}/{encoded.sha256[:12]}",
                                          cluster_id=cid, round_idx=round_idx,
                                          member_robot_ids=sorted(members.get(cid, [])))
            # Signed: round, cluster, sha256, members and the header (chunk list, bulk address).
            out.meta["signature"] = (self.signer.sign_cluster_model(
                round_idx, cid, encoded.sha256, transfer=out.chunker.transfer_digest(),
                members=out.meta["member_robot_ids"]) if self.signer is not None else b"")
            for chunk in out.chunks():
                self.model_pub.publish(cluster_model_msg(chunk, stamp=stamp, **out.meta))
        self._published_models_round = round_idx
        self.get_logger().info(f"published {len(self.coord.cluster_models)} cluster model(s) for round {round_idx}")

    def _on_model_resend(self, msg) -> None:
        if not self._resend_limit.allow(time.monotonic()):
            self.resend_refused += 1
            self.get_logger().warning(f"model resend over the rate limit ({self.resend_refused} refused)", throttle_duration_sec=5)
            return
        if len(msg.data) > bounds.MAX_RESEND_REQUEST_CHARS:
            self.get_logger().warning(f"model resend request of {len(msg.data)} chars refused "
                                      f"(bound {bounds.MAX_RESEND_REQUEST_CHARS})")
            return
        if self.params.require_signatures:  # only allow-listed robots may ask (signed by their key)
            why = verify_json(msg.data, "model_resend",
                              lambda obj: self.allow_list.public_key(str(obj.get("robot_id", ""))[:256]))
            if why is not None:
                self.resend_refused += 1
                self.get_logger().warning(f"model resend request refused ({self.resend_refused} so far): {why[:200]}")
                return
        try:
            answer = self.models_out.resend(msg.data)
        except ValueError as exc:
            self.get_logger().warning(f"bad model resend request: {str(exc)[:200]}")
            return
        if answer is not None:  # None: an old round's model; the robot gets the current one
            out, chunks = answer
            for chunk in chunks:
                self.model_pub.publish(cluster_model_msg(chunk, **out.meta))

    # ------------------------------------------------------------------ descriptors / metrics
    def _on_descriptor(self, msg) -> None:
        why = bounds.oversized({"robot_id": (msg.robot_id, bounds.MAX_ID_CHARS),
                                "nonce": (msg.nonce, bounds.NONCE_BYTES),
                                "signature": (msg.signature, bounds.SIGNATURE_BYTES)}) \
            or bounds.oversized_items("score_robot_ids", msg.score_robot_ids, 4096, bounds.MAX_ID_CHARS)
        if why is not None:
            return self.intake.reject_oversized("descriptor", msg.robot_id, int(msg.round), why)
        rid = str(msg.robot_id)
        try:
            desc = descriptor_from_msg(msg)
        except ValueError as exc:
            self.coord.record_rejection(rid, str(exc)[:1000])
            self.audit.record(kind="descriptor", robot_id=rid, round_idx=int(msg.round),
                              decision=Decision(False, "bad_descriptor", str(exc)))
            self.get_logger().warning(f"descriptor from {rid!r} rejected: {str(exc)[:300]}")
            return
        decision = validate_descriptor(desc, self.intake.validation_ctx(), round_idx=int(msg.round),
                                       nonce=bytes(msg.nonce), signature=bytes(msg.signature), dims=int(msg.dims))
        if not decision:
            self.coord.record_rejection(rid, decision.reason)
            self.audit.record(kind="descriptor", robot_id=rid, round_idx=int(msg.round), decision=decision)
            self.get_logger().warning(f"descriptor from {rid} rejected: {decision.reason}")
            return
        decision = self.coord.offer_descriptor(desc, int(msg.round))
        self.audit.record(kind="descriptor", robot_id=rid, round_idx=int(msg.round), decision=decision)

    def _on_metrics(self, msg) -> None:
        if len(msg.robot_id) > bounds.MAX_ID_CHARS or len(msg.reason) > bounds.MAX_REASON_CHARS:
            return self.intake.reject_oversized("metrics", msg.robot_id, int(self.coord.round_idx),
                                          f"robot_id/reason over bound ({len(msg.robot_id)}/{len(msg.reason)} chars)")
        if not msg.accepted:  # the robot will not answer this stage, and says why
            verdict = self.coord.offer_decline(str(msg.robot_id), str(msg.reason))
            self.get_logger().info(f"{msg.robot_id} does not answer this stage: {msg.reason}"
                                   + ("" if verdict.accepted else f" ({verdict.reason})"))
            return
        verdict = self.coord.offer_metrics(str(msg.robot_id), float(msg.success_rate))
        if not verdict.accepted:
            self.get_logger().warning(f"metrics from {msg.robot_id}: {verdict.reason}")

    def destroy_node(self) -> None:
        """Stop the fetch workers and the bulk server, close the audit log."""
        # Defensive: also called by rclpy's context clean-up after a failed constructor.
        if getattr(self, "updates_in", None) is not None:
            self.updates_in.close()
        if getattr(self, "models_out", None) is not None:
            self.models_out.close()
        if getattr(self, "audit", None) is not None:
            self.audit.close()
        super().destroy_node()


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int:
    """Run the fleet server until Ctrl-C / SIGTERM (exit 0), failure, or (exit_when_done) the last round."""
    shutdown.init(args)  # Ctrl-C sets a flag the loop below observes (fed_ros.ros.shutdown)
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
        while rclpy.ok() and node.exit_code is None and not shutdown.requested():
            executor.spin_once(timeout_sec=0.1)
        code = node.exit_code or 0
        node.rounds_gate.deliver_done()  # exit 0 after STAGE_DONE: once the robots acknowledged it (<= 5 s)
    except (KeyboardInterrupt, ExternalShutdownException):
        code = 0
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())

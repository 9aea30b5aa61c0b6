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
    training_progress  fed_ros/msg/TrainingProgress  robots -> server, best effort: heartbeats
                                                  that extend a slow robot's deadline
    robot_metrics   fed_ros/msg/RobotMetrics      robots -> server (EVALUATE; accepted false:
                                                  sits a stage out, why)
    round_report    fed_ros/msg/RoundReport       RELIABLE + TRANSIENT_LOCAL, last 16
                                                  (fed-ros status)
    encoder         fed_ros/msg/FleetEncoder      with encoder_rounds: the fleet encoder,
                                                  RELIABLE + TRANSIENT_LOCAL, depth 1
    encoder_updates fed_ros/msg/EncoderUpdate     robots -> server (server/encoder.py)
    server/set_rounds  std_srvs/SetBool  pause new rounds (rounds_enabled);
    server/end_fleet   std_srvs/Trigger  end the federation after the current round

Order after a round (commit point): aggregate -> ModelStore.commit -> publish models ->
report -> next announcement. Killed at any point, the server restarts from the last
committed round with the same models. Parameters: config/server.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from std_msgs.msg import String

from fed_ros.core.checks.decisions import Decision
from fed_ros.core.rounds.spill import RoundSpills
from fed_ros.msg import (
    ClientDescriptor as DescriptorMsg,
    ClusterModel,
    EncoderUpdate,
    FleetEncoder,
    ModelUpdate,
    RobotMetrics,
    RoundAnnouncement,
    RoundReport,
    TrainingProgress,
    UpdateAck,
)
from fed_ros.ros import shutdown
from fed_ros.ros.nodes.node_process import run_node
from fed_ros.ros.wire import diagnostics, qos
from fed_ros.ros.configuration.fleet_params import ServerParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.ros.wire.transfer import TransferSender
from fed_ros.ros.wire.transfer_receiver import TransferReceiver
from fed_ros.ros.wire.chunk_assembler import TransferLimits
from fed_ros.srv import Register
from std_srvs.srv import SetBool, Trigger
from fed_ros.ros.nodes.handler_guard import HandlerGuard
from fed_ros.ros.nodes.server.rounds_gate import RoundsGate
from fed_ros.ros.nodes.server.config import live_round_settings, liveness_settings
from fed_ros.ros.nodes.server.encoder import ServerEncoder, open_encoder_stage
from fed_ros.ros.nodes.server.gauge import ServerGauge
from fed_ros.ros.nodes.server.heartbeats import HeartbeatIntake
from fed_ros.ros.nodes.server.keys import load_server_keys
from fed_ros.ros.nodes.server.models import ClusterModelPublisher
from fed_ros.ros.nodes.server.registration import RegistrationDesk
from fed_ros.ros.nodes.server.round_driver import RoundDriver
from fed_ros.ros.nodes.server.state import open_round_state
from fed_ros.ros.nodes.server.stage_inputs import StageInputs
from fed_ros.ros.nodes.server.updates import UpdateIntake

# Depth of the latched cluster-model topic: every chunk of every cluster's current model
# must fit (robots keep the newest round per cluster and ignore older samples).
MODEL_TOPIC_DEPTH = 64
# Samples the updates reader queues (KEEP_LAST): bounds the server's memory under a flood.
# Measured (hostile suite, 300 updates with 1 MB ids): KEEP_ALL +367 MiB, KEEP_LAST(8) +18 MiB.
UPDATES_INBOX_DEPTH = 8
# Round reports a late reader (fed-ros status, the demo) receives on connecting.
REPORT_HISTORY = 16


class FleetServer(Node):
    """Fleet server: a thin shell that turns messages into RoundCoordinator calls."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("server", **kwargs)
        # Typed, described parameters (ServerParams; ValueError names a bad one); a live
        # `ros2 param set` is applied (round timing, evaluation, exit_when_done) or refused.
        self.params = p = declare_typed_parameters(self, ServerParams, self._on_params_changed)

        self.keys = keys = load_server_keys(p)
        # The fleet encoder's stage (encoder_rounds > 0) first: the initial policy reads its
        # frozen trunk from the encoder's file.
        encoder_stage, encoder_cfg, encoder_file = open_encoder_stage(p)
        # The strategy, store, audit log and coordinator, resumed from the last commit.
        self.state = state = open_round_state(
            p, keys.allowed_keys, clock=self._now, backbone_weights=encoder_file
        )
        self.coord, self.audit, self.resumed = state.coord, state.audit, state.resumed
        self.limits = TransferLimits(max_total_bytes=p.max_update_bytes)
        log = self.get_logger()
        # The publishers first: the collaborators below publish through them.
        self.announce_pub = self.create_publisher(RoundAnnouncement, "round", qos.latched_qos())
        self.model_pub = self.create_publisher(
            ClusterModel, "cluster_models", qos.model_state_qos(MODEL_TOPIC_DEPTH)
        )
        # Reports keep a history: with KEEP_LAST(1) a report published right after another
        # can replace it before a reader acknowledged it (reliable + keep-last drops).
        self.report_pub = self.create_publisher(
            RoundReport, "round_report", qos.model_state_qos(REPORT_HISTORY)
        )
        self.resend_pub = self.create_publisher(String, "update_resend", qos.control_qos())
        self.ack_pub = self.create_publisher(UpdateAck, "update_acks", qos.control_qos())
        # Transfer: updates in (assembly, bulk fetch, the one payload check), cluster models out.
        self.updates_in = TransferReceiver(
            state.manifest,
            self.limits,
            max_pending=16,
            on_event=shutdown.unless_stopping(lambda text: self.get_logger().warning(text)),
        )
        self.models_out = TransferSender(
            p.transfer_channel,
            bulk_threshold_bytes=p.bulk_threshold_bytes,
            bulk_ttl_s=7 * 24 * 3600.0,
        )  # the current models stay fetchable
        # Cluster models out (after each commit) and their chunks re-sent on request.
        self.models = ClusterModelPublisher(
            coord=self.coord,
            models_out=self.models_out,
            publish=self.model_pub.publish,
            signer=keys.signer,
            allow_list=keys.allow_list,
            params=lambda: self.params,
            now_msg=self._now_msg,
            log=log,
        )
        # Updates: checks, assembly, one decision per payload id, acknowledgements.
        self.intake = UpdateIntake(
            coord=self.coord,
            updates_in=self.updates_in,
            audit=self.audit,
            publish_ack=self.ack_pub.publish,
            manifest=state.manifest,
            allow_list=keys.allow_list,
            replay_guard=keys.replay_guard,
            params=lambda: self.params,
            now=self._now,
            now_msg=self._now_msg,
            log=log,
            delta_base=self.models.sent_model,
            spills=(spills := RoundSpills(state.manifest, Path(p.state_dir) / "spill")),
        )
        self.stage_inputs = StageInputs(
            coord=self.coord, intake=self.intake, audit=self.audit, log=log
        )
        self.heartbeats = HeartbeatIntake(
            coord=self.coord, allow_list=keys.allow_list, audit=self.audit, log=log
        )
        self.registration = RegistrationDesk(
            coord=self.coord, registration_guard=keys.registration_guard, audit=self.audit, log=log
        )
        self.encoder: ServerEncoder | None = None
        if encoder_stage is not None and encoder_file is not None:
            # One message holds the whole encoder; depth 1: the current one is what counts.
            self.encoder_pub = self.create_publisher(FleetEncoder, "encoder", qos.latched_qos())
            self.encoder = ServerEncoder(
                stage=encoder_stage,
                cfg=encoder_cfg,
                weights_file=encoder_file,
                coord=self.coord,
                publish=self.encoder_pub.publish,
                signer=keys.signer,
                # The round driver takes this encoder, and this reads the driver's tracker:
                # a cycle, so the tracker is looked up when an encoder round reports.
                tracker=lambda: self.rounds.tracker,
                audit=self.audit,
                now=self._now,
                now_msg=self._now_msg,
                log=log,
            )
            self.coord.hold_before = encoder_stage.holds  # policy rounds wait for the encoder
        # Rounds on/off and the fleet's end (its services are created below).
        self.rounds_gate = gate = RoundsGate(
            self.coord,
            p.rounds_enabled,
            log=self.get_logger(),
            set_parameter=lambda param: self.set_parameters([param])[0],
            exit_code=lambda: self.exit_code,
            announce_pub=self.announce_pub,
        )
        # The tick: models -> report -> announcement, and the exit code.
        self.rounds = RoundDriver(
            coord=self.coord,
            updates_in=self.updates_in,
            intake=self.intake,
            models=self.models,
            publish_report=self.report_pub.publish,
            publish_announcement=self.announce_pub.publish,
            publish_resend=self.resend_pub.publish,
            keys=keys,
            after_round=self.rounds_gate.after_round,
            params=lambda: self.params,
            resumed=self.resumed,
            now_msg=self._now_msg,
            log=log,
            encoder=self.encoder,
        )

        group = MutuallyExclusiveCallbackGroup()  # every callback that touches round state
        # No handler can crash the node: a failing callback is logged with its type, counted
        # (guard.failures) and audited; the node keeps serving.
        self.guard = guard = HandlerGuard(self, on_error=self._audit_handler_failure)
        # Anyone on the domain can write here: KEEP_LAST bounds what DDS queues for us
        # (qos.inbox_qos).
        self.create_subscription(
            ModelUpdate,
            "updates",
            guard.wrap("updates", self.intake.on_update),
            qos.inbox_qos(UPDATES_INBOX_DEPTH),
            callback_group=group,
        )
        self.create_subscription(
            DescriptorMsg,
            "descriptors",
            guard.wrap("descriptors", self.stage_inputs.on_descriptor),
            qos.control_qos(),
            callback_group=group,
        )
        self.create_subscription(
            RobotMetrics,
            "robot_metrics",
            guard.wrap("robot_metrics", self.stage_inputs.on_metrics),
            qos.control_qos(),
            callback_group=group,
        )
        self.create_subscription(
            TrainingProgress,
            "training_progress",
            guard.wrap("training_progress", self.heartbeats.on_progress),
            qos.heartbeat_qos(),
            callback_group=group,
        )
        self.create_subscription(
            String,
            "model_resend",
            guard.wrap("model_resend", self.models.on_model_resend),
            qos.control_qos(),
            callback_group=group,
        )
        if self.encoder is not None:
            self.create_subscription(
                EncoderUpdate,
                "encoder_updates",
                guard.wrap("encoder_updates", self.encoder.on_update),
                qos.inbox_qos(UPDATES_INBOX_DEPTH),
                callback_group=group,
            )
            self.encoder.publish_current()
        self.create_service(
            Register,
            "register",
            guard.wrap("register", self.registration.on_register, RegistrationDesk.register_failed),
            callback_group=group,
        )
        self.create_timer(0.1, self.rounds.tick, callback_group=group)
        if p.spill_release_s > 0:
            # Its own group: it must run while the round group aggregates (which reads every
            # spilled row and would otherwise map them all into the RSS), and it touches no
            # round state. madvise releases the GIL (core/rounds/spill.py).
            self.create_timer(
                p.spill_release_s, spills.release, callback_group=MutuallyExclusiveCallbackGroup()
            )
        self.add_post_set_parameters_callback(gate.after_set)
        self.create_service(SetBool, "~/set_rounds", gate.on_set_rounds, callback_group=group)
        self.create_service(Trigger, "~/end_fleet", gate.on_end_fleet, callback_group=group)
        gauge = ServerGauge(
            diagnostics.status_name(self.get_namespace(), "server"),
            coord=self.coord,
            params=lambda: self.params,
            intake=self.intake,
            models=self.models,
        )
        diagnostics.attach(  # /diagnostics, 1 Hz
            self.create_publisher, self.create_timer, self._now_msg, gauge, callback_group=group
        )
        self.get_logger().info(
            f"fleet server: {p.algorithm} x {p.rounds} rounds, "
            f"store {Path(p.state_dir)} ({state.resume_note()}); "
            f"waiting for robots {p.robots_expected or ('>= ' + str(p.min_robots))}"
        )

    @property
    def exit_code(self) -> int | None:
        """None while serving; the process exit status once the round driver decided it."""
        return self.rounds.exit_code

    def _on_params_changed(self, params: ServerParams) -> None:
        """A live parameter change (already checked): round timing and evaluation from the next
        stage on."""
        self.params = params
        self.coord.settings = live_round_settings(self.coord.settings, params)
        self.coord.liveness = liveness_settings(params)  # from the next TRAIN stage on
        self.get_logger().info(f"parameters changed live: {self.coord.settings}")

    def _now(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _now_msg(self):
        return self.get_clock().now().to_msg()

    def _audit_handler_failure(self, name: str, exc: BaseException) -> None:
        self.audit.record(
            kind="handler_error",
            robot_id="",
            round_idx=int(self.coord.round_idx),
            decision=Decision(False, "handler_error", f"{name}: {type(exc).__name__}: {exc}"),
        )

    def destroy_node(self) -> None:
        """Stop the fetch workers and the bulk server, close the audit log."""
        # Defensive: also called by rclpy's context clean-up after a failed constructor.
        if getattr(self, "updates_in", None) is not None:
            self.updates_in.close()
        if getattr(self, "models_out", None) is not None:
            self.models_out.close()
        if getattr(self, "audit", None) is not None:
            self.audit.close()
        if getattr(self, "rounds", None) is not None:
            self.rounds.tracker.close()
        super().destroy_node()


def _stop(node: FleetServer, executor) -> int:
    # Exit 0 after STAGE_DONE: once the robots acknowledged it (<= 5 s; not on Ctrl-C).
    node.rounds_gate.deliver_done()
    return node.exit_code or 0


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int:
    """Run the fleet server until Ctrl-C / SIGTERM (exit 0), failure, or (exit_when_done) the
    last round; 2: bad configuration (FileNotFoundError: a pretrained backbone's weights file,
    its message says how to get it)."""
    return run_node(
        "server",
        FleetServer,
        args,
        threads=3,
        config_errors=(ValueError, FileNotFoundError),
        ended=lambda node: node.exit_code is not None,
        stop=_stop,
        shutdown_executor=False,
    )


if __name__ == "__main__":
    sys.exit(main())

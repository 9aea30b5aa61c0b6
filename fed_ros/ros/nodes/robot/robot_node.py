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

import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node

from fed_ros.ros import shutdown
from fed_ros.ros.nodes.node_process import run_node
from fed_ros.ros.nodes.robot.gauge import RobotGauge
from fed_ros.ros.nodes.robot.learning_gate import LearningGate
from fed_ros.ros.wire import diagnostics
from fed_ros.ros.wire.publish import wait_for_subscribers
from fed_ros.ros.wire.round_msgs import Announcement
from fed_ros.ros.configuration.fleet_params import RobotParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.ros.nodes.robot.announcements import AnnouncementFollower
from fed_ros.ros.nodes.robot.fleet_link import RobotFleetTopics, fleet_keys
from fed_ros.ros.nodes.robot.encoder import RobotEncoder, server_encoder_file, write_placeholder
from fed_ros.ros.nodes.robot.learner import make_learner
from fed_ros.ros.nodes.robot.demos import RobotDemonstrations
from fed_ros.ros.nodes.robot.rounds import RobotRounds, RoundsCollaborators
from fed_ros.ros.nodes.robot.transfer import RobotTransfer
from fed_ros.ros.nodes.robot.worker import STARTUP, JobWorker
from fed_ros.srv import EvaluatePolicy, Record
from std_srvs.srv import SetBool


class RobotNode(Node):
    """Onboard fleet client of one robot (thin: `RobotClient` learns, arm.driving drives the
    arm)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("robot", **kwargs)
        # Typed, described parameters (RobotParams); a live `ros2 param set` is applied or refused.
        self.params = p = declare_typed_parameters(
            self, RobotParams, self._on_params_changed, namespace=self.get_namespace()
        )
        self.robot_id: str = p.robot_id
        self.tasks: list[str] = list(p.tasks)
        self.data_dir = Path(p.data_dir)
        self.demo_dir = self.data_dir / "demos"
        self.model_dir = self.data_dir / "models"
        self.demo_dir.mkdir(parents=True, exist_ok=True)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        self.cameras = p.policy == "image"
        # Signed fleet: the robot's key signs what it sends; the server's key checks what it obeys.
        self.signer, self.server_key = fleet_keys(p)
        # The server's fleet encoder (vision_backbone fleet, no backbone_weights): the policy is
        # built on a placeholder file the first encoder from the server replaces.
        encoder_file = server_encoder_file(p)
        if encoder_file is not None:
            write_placeholder(encoder_file)
        # ValueError at start on a bad or forbidden setting
        self.learner = make_learner(p, str(encoder_file) if encoder_file else None)
        self.client, self.manifest = self.learner.client, self.learner.manifest

        fleet = p.fleet_namespace.rstrip("/")
        self._fleet_group = MutuallyExclusiveCallbackGroup()  # announcements, models, resends
        self._service_group = MutuallyExclusiveCallbackGroup()  # Record / EvaluatePolicy
        io_group = ReentrantCallbackGroup()  # arm topics (recorder, arm client)

        from fed_ros.ros.arm.driving import attach_arm

        self.arm, self.recorder = attach_arm(
            self,
            self.demo_dir,
            namespace=p.arm_namespace,
            robot_id=self.robot_id,
            cameras=self.cameras,
            camera_transport=p.camera_transport,
            image_size=self.learner.policy_cfg.image_size,
            callback_group=io_group,
        )

        self.fleet_topics = topics = RobotFleetTopics(
            self.create_publisher,
            self.create_subscription,
            self.create_client,
            fleet,
            register_group=io_group,
            encoder=encoder_file is not None,
        )
        self.descriptor_pub, self.metrics_pub = topics.descriptor_pub, topics.metrics_pub
        # Cluster models in, updates out (kept until acknowledged), resends both ways.
        self.transfer = RobotTransfer(
            p,
            self.manifest,
            update_pub=topics.update_pub,
            model_resend_pub=topics.model_resend_pub,
            signer=self.signer,
            server_key=self.server_key,
            data_dir=self.data_dir,
            log=self.get_logger(),
            wait_for_server=lambda: wait_for_subscribers(self, topics.update_pub, "updates"),
        )
        self.uplink, self.downlink = self.transfer.uplink, self.transfer.downlink
        # No handler can crash the node: failures are logged with their type and counted.
        from fed_ros.ros.nodes.handler_guard import HandlerGuard, refuse_service

        self.guard = guard = HandlerGuard(self)
        self.create_service(
            Record,
            "record",
            guard.wrap("record", self._on_record, refuse_service),
            callback_group=self._service_group,
        )
        self.create_service(
            EvaluatePolicy,
            "evaluate",
            guard.wrap("evaluate", self._on_evaluate, refuse_service),
            callback_group=self._service_group,
        )
        self.create_timer(0.5, self._tick, callback_group=self._fleet_group)
        # ~/set_learning; switching off stops an arm episode being driven (a HOLD after its last
        # command)
        self.gate = gate = LearningGate(
            p.learning_enabled,
            log=self.get_logger(),
            set_parameter=lambda param: self.set_parameters([param])[0],
            on_change=self._on_learning_changed,
        )
        self.add_post_set_parameters_callback(gate.after_set)
        self.create_service(
            SetBool, "~/set_learning", gate.on_set_learning, callback_group=io_group
        )

        self.encoder = (
            RobotEncoder(
                encoder_file,
                self.robot_id,
                self.server_key,
                self.downlink.refuse,
                self.get_logger(),
            )
            if encoder_file is not None
            else None
        )
        self.follower = AnnouncementFollower(
            self.robot_id, self.server_key, self.downlink.refuse, self.gate.skip, self.get_logger()
        )
        self.registered = threading.Event()
        self.worker = JobWorker(
            f"{self.robot_id}-worker",
            {
                STARTUP: self._startup,
                "announcement": self._handle_announcement,
                "encoder": self._train_encoder,
            },
            self.get_logger(),
        )
        self.stop_event = self.worker.stop_event
        # One driver of the arm at a time (bootstrap, EVALUATE stage, the Record service).
        self.arm_lock = threading.Lock()
        self.demos = RobotDemonstrations(
            self.demo_dir,
            lambda: self.params,
            self.arm,
            self.recorder,
            self.arm_lock,
            self.gate,
            self.get_logger(),
        )
        # The work of each announced stage, over the collaborators made above.
        self.rounds = RobotRounds(
            RoundsCollaborators(
                client=self.client,
                models=self.transfer.models,
                uplink=self.uplink,
                demos=self.demos,
                arm=self.arm,
                arm_lock=self.arm_lock,
                params=lambda: self.params,
                log=self.get_logger(),
                stop=self.stop_event,
                latest=lambda: self.follower.latest,
                signer=self.signer,
                model_dir=self.model_dir,
                log_transfer=self.transfer.log_transfer,
                descriptor_pub=self.descriptor_pub,
                metrics_pub=self.metrics_pub,
                wait_matched=lambda p, w: wait_for_subscribers(self, p, w),
                progress_pub=self.fleet_topics.progress_pub,
            )
        )
        # The fleet's topics last, when every handler's owner exists (no callback runs before
        # the node spins, but a handler is then a plain bound method, never a forward lambda).
        topics.subscribe(
            guard,
            self._fleet_group,
            on_round=self._on_announcement,
            on_cluster_model=self.downlink.on_cluster_model,
            on_update_resend=self.downlink.on_update_resend,
            on_peer_descriptor=self.rounds.on_peer_descriptor,
            on_update_ack=self.uplink.on_ack,
            on_encoder=self._on_encoder if encoder_file is not None else None,
        )
        gauge = RobotGauge(
            diagnostics.status_name(self.get_namespace(), "robot"),
            self.robot_id,
            transfer=self.transfer,
            follower=self.follower,
            rounds=self.rounds,
            gate=self.gate,
            registered=self.registered,
            failed=lambda: self.failed,
            arm_lock=self.arm_lock,
            worker=self.worker,
            demos=self.demos,
        )
        diagnostics.attach(  # /diagnostics, 1 Hz
            self.create_publisher,
            self.create_timer,
            lambda: self.get_clock().now().to_msg(),
            gauge,
            callback_group=io_group,
        )
        self.worker.start()
        self.worker.put(STARTUP)
        self.get_logger().info(
            f"robot {self.robot_id}: tasks {self.tasks}, data in {self.data_dir}, policy {p.policy}"
        )

    def _on_learning_changed(self, on: bool) -> None:
        if on:
            self.arm.resume()
        elif self.arm.halt("learning switched off"):
            self.get_logger().warning("learning switched off: arm episode stopped, HOLD sent")

    def _on_params_changed(self, params: RobotParams) -> None:
        """A live parameter change (already checked): training settings reach the next round's
        fit."""
        self.params = params
        self.client.local.update(params.local_training())
        self.get_logger().info(
            "parameters changed live; training settings now "
            f"{params.local_training()}, eval_episodes {params.eval_episodes}"
        )

    @property
    def failed(self) -> str:
        """Why the start-up failed ("" while it has not): main() exits 1 with it."""
        return self.worker.failed

    # ------------------------------------------------------------------ start-up
    def _startup(self, _arg=None) -> None:
        """Demonstrations first (collect_demos_on_start), then registration with the fleet."""
        self.demos.collect_on_start(self.stop_event)
        response = self.fleet_topics.register(
            self.robot_id,
            self.tasks,
            cameras=self.cameras,
            num_samples=sum(len(e) for e in self.demos.episodes()),
            signer=self.signer,
            timeout_s=self.params.register_timeout_s,
            stop=self.stop_event,
        )
        self.registered.set()
        self.get_logger().info(f"registered with the fleet (server round {response.current_round})")

    # ------------------------------------------------------------------ fleet messages
    def _on_announcement(self, msg) -> None:
        work = self.follower.on_message(msg)
        if work is not None:
            self.worker.put("announcement", work)

    def _tick(self) -> None:
        self.transfer.tick()

    def _on_encoder(self, msg) -> None:
        if self.encoder is None:  # (subscribed only with one)
            return
        job = self.encoder.on_message(msg)
        if job is not None:
            self.worker.put("encoder", job)

    # ------------------------------------------------------------------ round work
    def _handle_announcement(self, item: tuple[Announcement, int]) -> None:
        ann, stamp = item
        shutdown.wait_for(self.registered, math.inf, self.stop_event)
        if self.encoder is not None and not self.encoder.wait_for(
            ann.encoder_version, max(0.0, ann.deadline_s - time.time()), self.stop_event
        ):
            self.get_logger().warning(
                f"round {ann.round_idx} {ann.stage}: fleet encoder version "
                f"{ann.encoder_version} not received by the deadline (have "
                f"{self.encoder.version}); not taking part"
            )
            return
        if self.follower.still_due(ann, stamp) and not self.gate.skip(
            f"round {ann.round_idx} {ann.stage}"
        ):
            self.rounds.run_stage(ann)

    def _train_encoder(self, job) -> None:
        """An encoder round the server asked for, on every recorded episode."""
        shutdown.wait_for(self.registered, math.inf, self.stop_event)
        if self.gate.skip(f"fleet encoder version {job.version}"):
            return
        episodes = self.demos.episodes()
        if not episodes:
            self.get_logger().info(
                f"fleet encoder version {job.version}: no recorded episodes; not taking part"
            )
            return
        pub, encoder = self.fleet_topics.encoder_update_pub, self.encoder
        if pub is None or encoder is None:  # (jobs come only from a robot taking the encoder)
            return

        def publish(msg) -> None:
            wait_for_subscribers(self, pub, "encoder_updates")
            pub.publish(msg)

        encoder.train(job, self.client, episodes, publish)

    # ------------------------------------------------------------------ services
    def _on_record(self, request, response):
        return self.demos.answer_record(request, response, self.tasks[0])

    def _on_evaluate(self, request, response):
        if self.gate.skip("EvaluatePolicy"):
            response.ok, response.message = False, "learning disabled (learning_enabled false)"
            return response
        return self.rounds.answer_evaluate(request, response)

    def destroy_node(self) -> None:
        """Stop driving the arm (a HOLD after the last command), then the worker, the bulk server,
        the recorder."""
        # Defensive: also called by rclpy's context clean-up after a failed constructor.
        if getattr(self, "arm", None) is not None and self.context.ok():
            if self.arm.halt("robot node shutting down"):
                self.get_logger().info("shutting down: HOLD sent to the arm after its last command")
        if getattr(self, "worker", None) is not None:
            self.worker.stop()
        if getattr(self, "rounds", None) is not None:
            self.rounds.tracker.close()  # after the worker: no step writes to a closed file
        if getattr(self, "transfer", None) is not None:
            self.transfer.close()
        if getattr(self, "recorder", None) is not None:
            self.recorder.destroy()
        super().destroy_node()


def _stop(node: RobotNode, executor) -> int:
    if node.failed and not shutdown.requested():
        node.get_logger().fatal(node.failed)
        return 1
    return 0


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
def main(args: list[str] | None = None) -> int:
    """Run the robot node until Ctrl-C / SIGTERM (exit 0) or a failed start-up (exit 1); 2: bad
    configuration (FileNotFoundError: a pretrained backbone's weights file, its message says how
    to get it)."""
    return run_node(
        "robot",
        RobotNode,
        args,
        threads=4,
        config_errors=(ValueError, FileNotFoundError),
        ended=lambda node: bool(node.failed),
        stop=_stop,
        shutdown_executor=False,
    )


if __name__ == "__main__":
    sys.exit(main())

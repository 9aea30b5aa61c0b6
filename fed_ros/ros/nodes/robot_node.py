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
import sys
import threading
import time
from pathlib import Path
from typing import Any

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import String

from fed_ros.msg import ClientDescriptor as DescriptorMsg, ClusterModel, ModelUpdate, RobotMetrics, RoundAnnouncement, UpdateAck
from fed_ros.ros import shutdown
from fed_ros.ros.shutdown import ShutdownRequested
from fed_ros.ros.arm.bridge_eval import EpisodeInterrupted
from fed_ros.ros.nodes.learning_gate import LearningGate
from fed_ros.ros.wire import diagnostics, qos
from fed_ros.ros.wire.publish import wait_for_subscribers
from fed_ros.ros.wire.round_msgs import Announcement, announcement_from_msg
from fed_ros.ros.fleet.params import RobotParams
from fed_ros.ros.nodes.typed_params import declare_typed_parameters
from fed_ros.core.rounds.coordinator import DONE
from fed_ros.ros.nodes.model_cache import ModelCache
from fed_ros.ros.nodes.robot_demos import RobotDemonstrations
from fed_ros.ros.nodes.robot_rounds import RobotRounds
from fed_ros.ros.nodes.robot_downlink import RobotDownlink
from fed_ros.ros.nodes.robot_uplink import UpdateUplink
from fed_ros.ros.wire.transfer import TransferReceiver
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
            from fed_ros.core.security.auth import Signer
            self.signer = Signer.from_file(p.private_key_file)
        self.server_key = None  # announcements, models, resend requests must carry the server's signature
        if p.allowed_keys_file:
            from fed_ros.core.security.auth import AllowList
            self.server_key = AllowList.from_yaml(p.allowed_keys_file).server

        if p.torch_threads:
            import torch
            torch.set_num_threads(p.torch_threads)
        from fed_ros.core.params import manifest_of
        from fed_ros.learning.client import RobotClient
        from fed_ros.learning.configuration_policy import PolicyConfig
        from fed_ros.learning.trainer import initial_state_dict
        self.policy_cfg = PolicyConfig(kind=p.policy, use_object_state=None if p.use_object_state else False)
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
        cams = dict(cameras=self.cameras, camera_transport=p.camera_transport, image_size=self.policy_cfg.image_size)
        self.arm = ArmClient(self, namespace=arm_ns, source="policy", callback_group=io_group, **cams)
        self.recorder = Recorder(self, self.demo_dir, namespace=arm_ns, robot_id=self.robot_id,
                                 callback_group=io_group, **cams)

        self.update_pub = self.create_publisher(ModelUpdate, f"{fleet}/updates", qos.control_qos())
        self.descriptor_pub = self.create_publisher(DescriptorMsg, f"{fleet}/descriptors", qos.control_qos())
        self.metrics_pub = self.create_publisher(RobotMetrics, f"{fleet}/robot_metrics", qos.control_qos())
        self.model_resend_pub = self.create_publisher(String, f"{fleet}/model_resend", qos.control_qos())
        self.uplink = UpdateUplink(  # updates out, kept until acknowledged
            self.update_pub, self.robot_id, signer=self.signer, transfer_channel=p.transfer_channel,
            bulk_threshold_bytes=p.bulk_threshold_bytes, retry_s=p.update_retry_s, log_transfer=self.log_transfer,
            log=self.get_logger(), wait_for_server=lambda: wait_for_subscribers(self, self.update_pub, "updates"))
        # No handler can crash the node: failures are logged with their type and counted.
        from fed_ros.ros.nodes.handler_guard import HandlerGuard, refuse_service
        self.guard = guard = HandlerGuard(self)
        self.create_subscription(RoundAnnouncement, f"{fleet}/round", guard.wrap("round", self._on_announcement),
                                 qos.latched_qos(),
                                 callback_group=self._fleet_group)
        self.create_subscription(ClusterModel, f"{fleet}/cluster_models",
                                 guard.wrap("cluster_models", lambda msg: self.downlink.on_cluster_model(msg)),
                                 qos.model_state_qos(MODEL_TOPIC_DEPTH), callback_group=self._fleet_group)
        self.create_subscription(String, f"{fleet}/update_resend", guard.wrap("update_resend", lambda msg: (
            self.downlink.on_update_resend(msg))), qos.control_qos(), callback_group=self._fleet_group)
        self.create_subscription(DescriptorMsg, f"{fleet}/descriptors", guard.wrap("descriptors", lambda msg: (
            self.rounds.on_peer_descriptor(msg))), qos.control_qos(), callback_group=self._fleet_group)
        self.create_subscription(UpdateAck, f"{fleet}/update_acks", guard.wrap("update_acks", self.uplink.on_ack),
                                 qos.control_qos(), callback_group=self._fleet_group)
        self.register_client = self.create_client(Register, f"{fleet}/register", callback_group=io_group)
        self.create_service(Record, "record", guard.wrap("record", self._on_record, refuse_service),
                            callback_group=self._service_group)
        self.create_service(EvaluatePolicy, "evaluate", guard.wrap("evaluate", self._on_evaluate, refuse_service),
                            callback_group=self._service_group)
        self.create_timer(0.5, self._tick, callback_group=self._fleet_group)
        diagnostics.attach(self, "robot", callback_group=io_group)  # /diagnostics, 1 Hz
        # ~/set_learning; switching off stops an arm episode being driven (a HOLD after its last command)
        self.gate = LearningGate(self, p.learning_enabled, callback_group=io_group,
                                 on_change=self._on_learning_changed)

        # Transfer: cluster models in (the one payload check), updates out (kept until acknowledged).
        self.models_in = TransferReceiver(self.manifest, max_pending=8,
                                          on_event=shutdown.unless_stopping(lambda text: self.get_logger().warning(text)))
        self.models = ModelCache()  # the receive path (downlink) stores into it
        self.downlink = RobotDownlink(models=self.models, models_in=self.models_in, uplink=self.uplink,
                                      server_key=self.server_key, log_transfer=self.log_transfer, log=self.get_logger())
        self._latest: Announcement | None = None
        self._latest_stamp = 0
        self._handled: set[tuple[int, str, int]] = set()
        self.registered = threading.Event()
        self.jobs: queue.Queue = queue.Queue()
        self.stop_event = threading.Event()
        self.arm_lock = threading.Lock()  # one driver at a time (bootstrap, EVALUATE stage, service)
        self.failed: str = ""
        self.demos = RobotDemonstrations(self.demo_dir, lambda: self.params, self.arm, self.recorder,
                                         self.arm_lock, self.gate, self.get_logger())
        self.rounds = RobotRounds(  # the work of each announced stage, over the collaborators made above
            self.client, self.models, self.uplink, self.demos, self.arm, self.arm_lock, lambda: self.params,
            self.get_logger(), self.stop_event, lambda: self.latest_announcement, self.signer, self.model_dir,
            self.log_transfer, self.descriptor_pub, self.metrics_pub, lambda p, w: wait_for_subscribers(self, p, w))
        self._transfer_log = open(self.data_dir / "transfers.jsonl", "a", encoding="utf-8")
        self._worker = threading.Thread(target=self._work, name=f"{self.robot_id}-worker", daemon=True)
        self._worker.start()
        self.jobs.put(("startup", None))
        self.get_logger().info(f"robot {self.robot_id}: tasks {self.tasks}, data in {self.data_dir}, "
                               f"policy {p.policy}")

    def _on_learning_changed(self, on: bool) -> None:
        if on:
            self.arm.resume()
        elif self.arm.halt("learning switched off"):
            self.get_logger().warning("learning switched off: arm episode stopped, HOLD sent")

    def _on_params_changed(self, params: RobotParams) -> None:
        """A live parameter change (already checked): training settings reach the next round's fit."""
        self.params = params
        self.client.local.update(params.local_training())
        self.get_logger().info("parameters changed live; training settings now "
                               f"{params.local_training()}, eval_episodes {params.eval_episodes}")

    # ------------------------------------------------------------------ bookkeeping
    def log_transfer(self, **entry: Any) -> None:
        entry["time"] = round(time.time(), 3)
        self._transfer_log.write(json.dumps(entry) + "\n")
        self._transfer_log.flush()

    def _work(self) -> None:
        """The worker thread: one long job at a time, in order."""
        while not self.stop_event.is_set():
            try:
                kind, arg = self.jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                if kind == "startup":
                    self._startup()
                elif kind == "announcement":
                    self._handle_announcement(arg)
            except ShutdownRequested:
                return
            except EpisodeInterrupted as exc:  # learning switched off mid-episode: expected
                self.get_logger().info(f"{kind}: {exc}")
            except Exception as exc:  # noqa: BLE001 - report, keep the node alive for the next round
                if self.stop_event.is_set() or shutdown.requested():
                    return  # e.g. a publisher whose context just went away: not an error
                import traceback
                self.get_logger().error(f"{kind} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                if kind == "startup":
                    self.failed = f"startup failed: {exc}"

    # ------------------------------------------------------------------ start-up
    def episodes(self) -> list:
        """Successful demonstrations (robot_demos)."""
        return self.demos.episodes()

    def _startup(self) -> None:
        self.demos.collect_on_start(self.stop_event)
        self._register()

    def _register(self) -> None:
        from fed_ros.ros.wire.register import register_request, register_with_fleet
        import torch
        num_samples = sum(len(e) for e in self.episodes())
        # Signed (fresh timestamp + nonce each attempt) when the robot has a key: a server
        # with require_signatures admits only proof of possession of the allow-listed key.
        response = register_with_fleet(self.register_client, lambda: register_request(
            self.robot_id, tasks=self.tasks, cameras=["agentview", "wrist"] if self.cameras else [],
            action_dim=4, has_gpu=bool(torch.cuda.is_available()), num_samples=num_samples, signer=self.signer),
            timeout_s=self.params.register_timeout_s, stop=self.stop_event)
        self.registered.set()
        self.get_logger().info(f"registered with the fleet (server round {response.current_round})")

    # ------------------------------------------------------------------ fleet messages
    @property
    def latest_announcement(self) -> Announcement | None:
        """The newest round announcement received from the server."""
        return self._latest

    def _on_announcement(self, msg) -> None:
        from fed_ros.ros.wire.signed import verify_msg
        why = verify_msg(msg, "round", self.server_key)  # a fake server's announcement is never obeyed
        if why is not None:
            return self.downlink.refuse("round", why)
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
        if self.robot_id not in ann.participants or self.gate.skip(f"round {ann.round_idx} {ann.stage}"):
            return
        key = (ann.round_idx, ann.stage, stamp)
        if key in self._handled:
            return
        self._handled.add(key)
        self.jobs.put(("announcement", (ann, stamp)))

    def _tick(self) -> None:
        if shutdown.requested():
            return  # peers stop with us: their fetches and our re-sends failing now are no fault
        for request in self.models_in.resend_requests():
            from fed_ros.ros.wire.signed import sign_json
            self.model_resend_pub.publish(String(data=sign_json(request, "model_resend", self.signer, self.robot_id)))
        for result in self.models_in.completed():
            self.downlink.store_model(result)
        self.uplink.resend_due()

    # ------------------------------------------------------------------ round work
    def _handle_announcement(self, item: tuple[Announcement, int]) -> None:
        ann, stamp = item
        shutdown.wait_for(self.registered, math.inf, self.stop_event)
        if self._latest_stamp != stamp and self._latest is not None and (
                self._latest.round_idx, self._latest.stage) != (ann.round_idx, ann.stage):
            return  # superseded while queued (e.g. a straggler's stage already closed)
        if ann.deadline_s < time.time():
            self.get_logger().warning(f"round {ann.round_idx} {ann.stage}: deadline already passed, skipping")
            return
        if not self.gate.skip(f"round {ann.round_idx} {ann.stage}"):
            self.rounds.run_stage(ann)

    # ------------------------------------------------------------------ services
    def _on_record(self, request, response):
        from fed_ros.ros.arm.driving import answer_record
        response = answer_record(self.recorder, request, response, self.tasks[0], self.params.variation)
        if request.command == Record.Request.STOP:
            self.demos.status()
        return response

    def _on_evaluate(self, request, response):
        if self.gate.skip("EvaluatePolicy"):
            response.ok, response.message = False, "learning disabled (learning_enabled false)"
            return response
        return self.rounds.answer_evaluate(request, response)

    def destroy_node(self) -> None:
        """Stop driving the arm (a HOLD after the last command), then the worker, the bulk server, the recorder."""
        # Defensive: also called by rclpy's context clean-up after a failed constructor.
        if getattr(self, "arm", None) is not None and self.context.ok():
            if self.arm.halt("robot node shutting down"):
                self.get_logger().info("shutting down: HOLD sent to the arm after its last command")
        if getattr(self, "stop_event", None) is not None:
            self.stop_event.set()
            self._worker.join(timeout=2.0)
        if getattr(self, "uplink", None) is not None:
            self.uplink.close()
        if getattr(self, "models_in", None) is not None:
            self.models_in.close()
        if getattr(self, "recorder", None) is not None:
            self.recorder.destroy()
        if getattr(self, "_transfer_log", None) is not None:
            self._transfer_log.close()
        super().destroy_node()


@shutdown.node_main  # ends the process with os._exit after main()'s own teardown
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
    return code


if __name__ == "__main__":
    sys.exit(main())

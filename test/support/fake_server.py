"""A fake fleet server that a real robot node talks to."""

from __future__ import annotations

import json
from fed_ros.core.security import auth
from fed_ros.ros.rigs.scripted import initial_model


class FakeServer:
    """Publishes on the server's topics with whatever key it is given (or none); reads the
    robot's refused-control count from /diagnostics (exact, where the refusal log is
    rate-limited)."""

    def __init__(self) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from std_msgs.msg import String

        from fed_ros.msg import ClusterModel, RoundAnnouncement
        from fed_ros.ros.wire import qos

        self.String, self.RoundAnnouncement = String, RoundAnnouncement
        self.ctx = Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("fake_server", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.models = self.node.create_publisher(
            ClusterModel, "/fleet/cluster_models", qos.model_state_qos(64)
        )
        self.resend = self.node.create_publisher(String, "/fleet/update_resend", qos.control_qos())
        self.rounds = self.node.create_publisher(
            RoundAnnouncement, "/fleet/round", qos.latched_qos()
        )
        self.refused = -1  # the robot's refused_control_messages, as last published
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name == "fed_ros/robot_0/robot":
                values = {kv.key: kv.value for kv in status.values}
                self.refused = int(values.get("refused_control_messages", self.refused))

    def spin(self) -> None:
        self.executor.spin_once(timeout_sec=0.05)

    def send_model(self, round_idx: int, signer: auth.Signer | None, tag: str) -> int:
        """A well-formed cluster model (the fleet's manifest) signed by ``signer`` (None:
        unsigned)."""
        from fed_ros.ros.wire.tensors import encode_state_dict
        from fed_ros.ros.wire.round_msgs import cluster_model_msg
        from fed_ros.ros.wire.chunk_sender import ChunkedSender

        encoded = encode_state_dict(initial_model())
        sender = ChunkedSender(encoded, f"cluster_0/r{round_idx}/{tag}", chunk_bytes=64 << 10)
        members = ["robot_0"]
        sig = (
            b""
            if signer is None
            else signer.sign_cluster_model(
                round_idx, 0, encoded.sha256, transfer=sender.transfer_digest(), members=members
            )
        )
        chunks = list(sender.chunks())
        for chunk in chunks:
            self.models.publish(
                cluster_model_msg(
                    chunk,
                    cluster_id=0,
                    round_idx=round_idx,
                    member_robot_ids=members,
                    signature=sig,
                )
            )
        return len(chunks)

    def send_done(self, round_idx: int, signer: auth.Signer | None) -> None:
        """A DONE announcement (a robot obeying it stops taking part) signed by ``signer``."""
        from fed_ros.ros.wire.signed import sign_msg

        msg = self.RoundAnnouncement(
            round=round_idx,
            stage=self.RoundAnnouncement.STAGE_DONE,
            algorithm="fedavg",
            participants=["robot_0"],
            quorum=0,
        )
        self.rounds.publish(sign_msg(msg, "round", signer))

    def send_resend(self, signer: auth.Signer | None, i: int = 0) -> None:
        from fed_ros.ros.wire.signed import sign_json

        request = json.dumps({"payload_id": f"robot_0/r0/{i:08x}", "chunks": [0]})
        self.resend.publish(
            self.String(data=sign_json(request, "update_resend", signer))
        )  # None: unsigned

    def close(self) -> None:
        self.node.destroy_node()
        self.ctx.try_shutdown()

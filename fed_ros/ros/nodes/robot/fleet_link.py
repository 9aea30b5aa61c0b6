"""The robot's side of the fleet server's interface: its keys, its topics, its registration.

Every topic a robot publishes or subscribes under ``fleet_namespace`` is created here, in one
place, with its QoS (config/security/fleet.policy.xml must grant exactly these; test_auth
reads them from this file). Handlers stay with the objects that own their state (downlink,
uplink, rounds, the announcement follower); the node passes them in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from std_msgs.msg import String

from fed_ros.msg import (
    ClientDescriptor as DescriptorMsg,
    ClusterModel,
    EncoderUpdate,
    FleetEncoder,
    ModelUpdate,
    RobotMetrics,
    RoundAnnouncement,
    TrainingProgress,
    UpdateAck,
)
from fed_ros.ros.wire import qos
from fed_ros.srv import Register

MODEL_TOPIC_DEPTH = 64  # matches the server's latched cluster-model topic


def fleet_keys(params) -> tuple[Any, Any]:
    """(the robot's Signer or None, the server's public key or None) from its key files.

    With a server key, announcements, models and resend requests must carry the server's
    signature; with a signer, everything the robot sends is signed."""
    from fed_ros.core.security.auth import AllowList, Signer

    signer = Signer.from_file(params.private_key_file) if params.private_key_file else None
    server_key = (
        AllowList.from_yaml(params.allowed_keys_file).server if params.allowed_keys_file else None
    )
    return signer, server_key


class RobotFleetTopics:
    """Publishers and the register client under ``fleet`` (the fleet namespace, no trailing /).

    ``create_publisher``, ``create_subscription`` and ``create_client`` are the owning node's
    (explicit collaborators, never the node)."""

    def __init__(
        self,
        create_publisher: Callable[..., Any],
        create_subscription: Callable[..., Any],
        create_client: Callable[..., Any],
        fleet: str,
        register_group: Any,
        encoder: bool = False,
    ) -> None:
        self.create_subscription, self.fleet = create_subscription, fleet
        # Only a robot taking the server's fleet encoder sends encoder updates.
        self.encoder_update_pub = (
            create_publisher(EncoderUpdate, f"{fleet}/encoder_updates", qos.control_qos())
            if encoder
            else None
        )
        self.update_pub = create_publisher(ModelUpdate, f"{fleet}/updates", qos.control_qos())
        self.descriptor_pub = create_publisher(
            DescriptorMsg, f"{fleet}/descriptors", qos.control_qos()
        )
        self.metrics_pub = create_publisher(
            RobotMetrics, f"{fleet}/robot_metrics", qos.control_qos()
        )
        self.model_resend_pub = create_publisher(String, f"{fleet}/model_resend", qos.control_qos())
        self.progress_pub = create_publisher(
            TrainingProgress, f"{fleet}/training_progress", qos.heartbeat_qos()
        )
        self.register_client = create_client(
            Register, f"{fleet}/register", callback_group=register_group
        )

    def subscribe(
        self,
        guard,
        group,
        *,
        on_round: Callable[[Any], None],
        on_cluster_model: Callable[[Any], None],
        on_update_resend: Callable[[Any], None],
        on_peer_descriptor: Callable[[Any], None],
        on_update_ack: Callable[[Any], None],
        on_encoder: Callable[[Any], None] | None = None,
    ) -> None:
        """The server's topics, each handler wrapped by ``guard`` (no handler crashes the node),
        all in the one mutually exclusive ``group``."""
        subscribe, fleet = self.create_subscription, self.fleet
        subscribe(
            RoundAnnouncement,
            f"{fleet}/round",
            guard.wrap("round", on_round),
            qos.latched_qos(),
            callback_group=group,
        )
        subscribe(
            ClusterModel,
            f"{fleet}/cluster_models",
            guard.wrap("cluster_models", on_cluster_model),
            qos.model_state_qos(MODEL_TOPIC_DEPTH),
            callback_group=group,
        )
        subscribe(
            String,
            f"{fleet}/update_resend",
            guard.wrap("update_resend", on_update_resend),
            qos.control_qos(),
            callback_group=group,
        )
        subscribe(
            DescriptorMsg,
            f"{fleet}/descriptors",
            guard.wrap("descriptors", on_peer_descriptor),
            qos.control_qos(),
            callback_group=group,
        )
        subscribe(
            UpdateAck,
            f"{fleet}/update_acks",
            guard.wrap("update_acks", on_update_ack),
            qos.control_qos(),
            callback_group=group,
        )
        if on_encoder is not None:
            # Latched, depth 1 (the server's): a robot joining late gets the current encoder.
            subscribe(
                FleetEncoder,
                f"{fleet}/encoder",
                guard.wrap("encoder", on_encoder),
                qos.latched_qos(),
                callback_group=group,
            )

    def register(
        self, robot_id: str, tasks, *, cameras: bool, num_samples: int, signer, timeout_s, stop
    ):
        """Register with the server until answered (the Register response)."""
        import torch

        from fed_ros.ros.wire.register import register_request, register_with_fleet

        # Signed (fresh timestamp + nonce each attempt) when the robot has a key: a server
        # with require_signatures admits only proof of possession of the allow-listed key.
        return register_with_fleet(
            self.register_client,
            lambda: register_request(
                robot_id,
                tasks=tasks,
                cameras=["agentview", "wrist"] if cameras else [],
                action_dim=4,
                has_gpu=bool(torch.cuda.is_available()),
                num_samples=num_samples,
                signer=signer,
            ),
            timeout_s=timeout_s,
            stop=stop,
        )

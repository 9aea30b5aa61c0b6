"""The robot's side of the fleet encoder stage: keep the server's encoder, train it when asked.

A robot whose policy says ``vision_backbone: fleet`` with ``backbone_weights: ''`` takes its
camera trunk from the server. Every FleetEncoder message (latched, so a robot that joins late
gets the current one at once) is checked (the server's signature, the robot's own manifest
for the announced FleetEncoderConfig) and written atomically as the robot's backbone file,
which the policy reads frozen and cached. When the message names this robot, it trains the
encoder on every recorded episode (``RobotClient.fit_encoder``) on the worker thread and
sends it back (EncoderUpdate). A policy stage waits until the robot holds the encoder version
its announcement names, so no policy trains on an encoder the fleet has replaced.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fed_ros.msg import EncoderUpdate
from fed_ros.ros import shutdown
from fed_ros.ros.wire.encoder_msgs import decode_encoder_payload, encoder_payload
from fed_ros.ros.wire.signed import verify_msg

ENCODER_FILE = "fleet_encoder.safetensors"


def server_encoder_file(params: Any) -> Path | None:
    """Where the robot keeps the server's encoder, or None when its policy does not use it."""
    if params.vision_backbone != "fleet" or params.backbone_weights:
        return None
    return Path(params.data_dir) / "models" / ENCODER_FILE


def write_placeholder(path: Path) -> None:
    """An untrained encoder file, so the policy can be built before the server's arrives (the
    trunk's shape does not depend on the weights; no policy stage runs on these)."""
    if path.is_file():
        return
    from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
    from fed_ros.learning.fleet_encoder import initial_encoder_state, save_backbone

    save_backbone(initial_encoder_state(FleetEncoderConfig()), path)


@dataclass(frozen=True)
class EncoderJob:
    """One encoder round this robot was asked to train."""

    version: int
    state: dict
    cfg: Any  # FleetEncoderConfig


class RobotEncoder:
    """The newest fleet encoder this robot holds, and the encoder rounds it must answer."""

    def __init__(self, path: Path, robot_id: str, server_key: Any, refuse: Any, log: Any) -> None:
        self.path, self.robot_id, self.server_key = path, robot_id, server_key
        self.refuse, self.log = refuse, log
        self.version = -1  # none from the server yet
        self._changed = threading.Condition()
        self._manifests: dict[str, tuple[Any, Any]] = {}  # config JSON -> (cfg, manifest)
        self._trained: set[int] = set()

    def _config(self, config_json: str) -> tuple[Any, Any]:
        """(FleetEncoderConfig, the encoder's manifest) for the announced settings."""
        if config_json not in self._manifests:
            from fed_ros.core.params import manifest_of
            from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
            from fed_ros.learning.fleet_encoder import initial_encoder_state

            try:
                cfg = FleetEncoderConfig(**json.loads(config_json))
            except (TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
                raise ValueError(f"encoder config {config_json[:200]!r}: {exc}") from None
            self._manifests = {config_json: (cfg, manifest_of(initial_encoder_state(cfg)))}
        return self._manifests[config_json]

    def on_message(self, msg: Any) -> EncoderJob | None:
        """Keep a newer encoder as the backbone file; the encoder round to train, or None."""
        why = verify_msg(msg, "fleet_encoder", self.server_key)
        if why is not None:
            self.refuse("fleet_encoder", why)
            return None
        version = int(msg.version)
        if version < self.version:
            return None  # an older sample (a resend): the newer file stays
        try:
            cfg, manifest = self._config(str(msg.config_json))
            state = decode_encoder_payload(msg.payload, manifest)
        except ValueError as exc:
            self.log.warning(f"fleet encoder version {version} refused: {exc}")
            return None
        if version > self.version:
            from fed_ros.learning.backbones.trunk import forget_frozen
            from fed_ros.learning.fleet_encoder import save_backbone

            forget_frozen(self.path)  # the next policy built reads the new trunk
            save_backbone(state, self.path)
            with self._changed:
                self.version = version
                self._changed.notify_all()
            self.log.info(f"fleet encoder version {version} saved as {self.path}")
        if self.robot_id not in msg.participants or version in self._trained:
            return None
        self._trained.add(version)
        return EncoderJob(version, state, cfg)

    def wait_for(self, version: int, timeout_s: float, stop: threading.Event) -> bool:
        """Wait (bounded, shutdown-aware) until the robot holds encoder ``version`` or newer."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.version < version:
                shutdown.check(stop)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, shutdown.POLL_S))
        return True

    def train(self, job: EncoderJob, client: Any, episodes: list, publish: Any) -> None:
        """One encoder round on every recorded episode, sent back whole."""
        result = client.fit_encoder(job.state, job.cfg, episodes, job.version)
        metrics = result.metrics
        cpu_s = float(metrics.get("cpu_s", math.nan))
        msg = EncoderUpdate(
            robot_id=self.robot_id,
            version=job.version,
            num_samples=int(result.num_samples),
            loss_first=float(metrics.get("loss_first", math.nan)),
            loss_last=float(metrics.get("loss_last", math.nan)),
            cpu_seconds=cpu_s,
            payload=encoder_payload(result.params, f"{self.robot_id}-encoder-{job.version}"),
        )
        publish(msg)
        self.log.info(
            f"fleet encoder version {job.version}: trained on {result.num_samples} frames in "
            f"{cpu_s:.1f} CPU s (loss {msg.loss_first:.3f} -> {msg.loss_last:.3f}), sent "
            f"{len(msg.payload.data)} B"
        )

"""The server's fleet encoder stage over ROS (``encoder_rounds`` > 0; off by default).

Before policy round 0, and every ``encoder_refresh_every`` policy rounds, every registered
robot (whatever its cluster) trains the shared camera encoder and sends it back; the server
averages them by frames and commits the result (:mod:`fed_ros.core.rounds.encoder_stage`
decides; this module only turns messages into its calls). Topics, in the server namespace:

    encoder          fed_ros/msg/FleetEncoder   the current encoder and who must train it;
                                                RELIABLE + TRANSIENT_LOCAL, depth 1 (late joiners)
    encoder_updates  fed_ros/msg/EncoderUpdate  robots -> server, the whole encoder in one message

The committed encoder is also written as the ``fleet`` backbone file the server's own policy
reads (``<state_dir>/encoder/fleet_encoder.safetensors``). Each committed encoder round's
frames, CPU seconds and bytes per robot go to TensorBoard (``encoder/...``, step = encoder
version) and into the next round report's diagnostics (``encoder.*``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from fed_ros.core.checks.decisions import Decision, Limits, MALFORMED
from fed_ros.core.checks import bounds
from fed_ros.core.rounds.encoder_stage import (
    ENCODER_DIR,
    EncoderAnnouncement,
    EncoderRoundReport,
    EncoderRounds,
    EncoderStage,
)
from fed_ros.msg import FleetEncoder
from fed_ros.ros.configuration.fleet_params import ServerParams
from fed_ros.ros.wire.encoder_msgs import decode_encoder_payload, encoder_payload
from fed_ros.ros.wire.signed import sign_msg

ENCODER_FILE = "fleet_encoder.safetensors"
# Set by encoder_rounds / encoder_refresh_every, not under encoder.*.
_SCHEDULE_FIELDS = ("rounds", "refresh_every")


def fleet_encoder_config(params: ServerParams) -> Any:
    """The FleetEncoderConfig of ``encoder.<field>`` parameters; ValueError names a bad one."""
    from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig

    known = {f.name for f in fields(FleetEncoderConfig)} - set(_SCHEDULE_FIELDS)
    settings = {
        k[len("encoder.") :]: v for k, v in params.extra.items() if k.startswith("encoder.")
    }
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(
            f"unknown server parameter 'encoder.{unknown[0]}' (known: "
            f"{', '.join('encoder.' + k for k in sorted(known))}; the schedule is "
            "encoder_rounds / encoder_refresh_every)"
        )
    try:
        return FleetEncoderConfig(
            **settings, rounds=params.encoder_rounds, refresh_every=params.encoder_refresh_every
        )
    except (TypeError, ValueError) as exc:
        raise ValueError(f"server parameters encoder.*: {exc}") from None


def open_encoder_stage(params: ServerParams) -> tuple[EncoderStage | None, Any, str | None]:
    """(the stage, its FleetEncoderConfig, the backbone file the policy reads), or Nones when
    the fleet encoder is off. Resumes the committed encoder; writes the file first, as the
    server's initial policy reads its frozen trunk from it."""
    if not params.encoder_rounds:
        return None, None, None
    from fed_ros.learning.fleet_encoder import initial_encoder_state, save_backbone

    cfg = fleet_encoder_config(params)
    rounds = EncoderRounds(
        Path(params.state_dir),
        initial_encoder_state(cfg),
        Limits(max_num_samples=params.max_samples),
    )
    stage = EncoderStage(
        rounds, params.encoder_rounds, params.encoder_refresh_every, params.encoder_timeout_s
    )
    path = save_backbone(rounds.state, Path(params.state_dir) / ENCODER_DIR / ENCODER_FILE)
    return stage, cfg, str(path)


class ServerEncoder:
    """The encoder stage's messages: announce and publish the encoder, take robots' updates."""

    def __init__(
        self,
        *,
        stage: EncoderStage,
        cfg: Any,
        weights_file: str,
        coord: Any,
        publish: Callable[[Any], None],
        signer: Any,
        tracker: Callable[[], Any],
        audit: Any,
        now: Callable[[], float],
        now_msg: Callable[[], Any],
        log: Any,
    ) -> None:
        self.stage, self.cfg, self.weights_file, self.coord = stage, cfg, weights_file, coord
        self.publish_msg, self.signer, self.tracker = publish, signer, tracker
        self.audit, self.now, self.now_msg, self.log = audit, now, now_msg, log
        self.config_json = json.dumps(cfg.to_dict(), sort_keys=True)
        self._diagnostics: dict[str, float] = {}

    @property
    def version(self) -> int:
        """The committed encoder's version (what policy stages must read)."""
        return self.stage.rounds.version

    def publish_current(self) -> None:
        """The committed encoder, nobody asked to train (at start: late joiners get it)."""
        self._publish(EncoderAnnouncement(self.version, (), self.now()))

    def tick(self) -> None:
        """Start a due encoder stage while the coordinator holds its round; close rounds."""
        coord = self.coord
        if self.stage.current is None:
            idle = coord.held and coord.collector is None and not coord.paused
            if idle and not (coord.finished or coord.end_requested):
                if self.stage.holds(coord.round_idx) and coord.roster.ids:
                    started = self.stage.start(coord.round_idx, tuple(coord.roster.ids), self.now())
                    self._publish(started)
            return
        nxt, report = self.stage.poll(self.now())
        if report is not None:
            self._committed(report)
        if nxt is not None:
            self._publish(nxt)

    def _publish(self, ann: EncoderAnnouncement) -> None:
        msg = FleetEncoder(
            version=int(ann.version),
            participants=list(ann.participants),
            config_json=self.config_json,
            payload=encoder_payload(self.stage.rounds.state, f"encoder-{ann.version}"),
        )
        msg.header.stamp = self.now_msg()
        self.publish_msg(sign_msg(msg, "fleet_encoder", self.signer))
        who = f"{len(ann.participants)} robots to train it" if ann.participants else "final"
        self.log.info(f"published fleet encoder version {ann.version} ({who})")

    def _committed(self, report: EncoderRoundReport) -> None:
        """The new encoder is the policy's backbone file; its costs go to the tracker and the
        next round report."""
        from fed_ros.learning.backbones.trunk import forget_frozen
        from fed_ros.learning.fleet_encoder import save_backbone

        forget_frozen(self.weights_file)  # (policies the server builds from now read the new one)
        save_backbone(self.stage.rounds.state, self.weights_file)
        scalars = report.scalars()
        per_robot = {
            f"{rid}/{name}": float(value)
            for rid, cost in report.costs.items()
            for name, value in (
                ("cpu_s", cost.cpu_s),
                ("bytes", cost.bytes_down + cost.bytes_up),
                ("frames", cost.frames),
            )
        }
        try:
            tracker = self.tracker()
            tracker.scalars(
                {f"encoder/{k}": v for k, v in {**scalars, **per_robot}.items()}, report.version
            )
            tracker.flush()
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the fleet
            self.log.warning(f"tracking encoder version {report.version} failed: {exc}")
        self._diagnostics.update({f"encoder.{k}": v for k, v in scalars.items()})
        self._diagnostics.update({f"encoder.{k}": v for k, v in per_robot.items()})
        self._diagnostics["encoder.version"] = float(report.version)
        refused = "; ".join(f"{r}: {why}" for r, why in report.refused.items()) or "none"
        self.log.info(
            f"fleet encoder version {report.version}: {len(report.costs)} robots averaged by "
            f"frames ({scalars['frames']:.0f}), loss {scalars['loss_first']:.3f} -> "
            f"{scalars['loss_last']:.3f}, {scalars['cpu_s_per_robot']:.1f} CPU s and "
            f"{scalars['bytes_per_robot']:.0f} B per robot; refused: {refused}"
        )

    def take_diagnostics(self) -> dict[str, float]:
        """The encoder rounds committed since the last round report, for the next one."""
        out, self._diagnostics = self._diagnostics, {}
        return out

    def on_update(self, msg: Any) -> None:
        """A robot's encoder: decoded by the server's own manifest, then admitted or refused."""
        robot_id = bounds.clip(msg.robot_id, 64)
        try:
            params = decode_encoder_payload(msg.payload, self.stage.rounds.manifest)
        except ValueError as exc:
            decision = self.stage.rounds.refuse(
                robot_id, Decision(False, MALFORMED, f"encoder payload: {exc}")
            )
        else:
            cpu_s = float(msg.cpu_seconds)
            decision = self.stage.offer(
                robot_id,
                int(msg.version),
                params,
                int(msg.num_samples),
                {
                    "cpu_s": cpu_s if math.isfinite(cpu_s) and cpu_s >= 0 else math.nan,
                    "loss_first": float(msg.loss_first),
                    "loss_last": float(msg.loss_last),
                },
                len(msg.payload.data),
            )
        self.audit.record(
            kind="encoder_update",
            robot_id=robot_id,
            # Not the policy round's counters: an encoder version is its own id space.
            round_idx=f"encoder-{int(msg.version)}",
            decision=decision,
        )
        if not decision:
            self.log.warning(f"encoder update of {robot_id!r} refused: {decision.reason}")

"""The fleet encoder stage of `fed-ros bench federation`: every robot trains the shared visual
encoder on all its recorded frames (`RobotClient.fit_encoder`, the robot node's call) and the
server FedAvgs it across the whole fleet (`fleet_encoder.aggregate_encoders`), before the
policy rounds and again every ``refresh_every`` policy rounds.

A cell whose policy says ``vision_backbone="fleet"`` runs it (`federation_run.run_cell`); the
encoder file it writes is the ``backbone_weights`` every policy of the cell reads, frozen and
cached. Rewriting the file in place is what a refresh does: the frozen trunk is keyed by the
file's modification time and size, so the next policy built reads the new weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.core.data.episode import Episode
from fed_ros.learning.backbones.specs import FLEET
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
from fed_ros.learning.configuration_policy import PolicyConfig


class FleetEncoderStage:
    """The server's side of the encoder rounds: the current encoder, its file, its schedule."""

    def __init__(self, cfg: FleetEncoderConfig, path: str | Path) -> None:
        from fed_ros.learning.fleet_encoder import initial_encoder_state, save_backbone

        self.cfg = cfg
        self.state = initial_encoder_state(cfg)
        # Written at once: building any fleet-backbone policy (a client's placeholder model,
        # the initial model) reads the file, before the first stage has trained it.
        self.path = save_backbone(self.state, path)
        self.rounds_run = 0

    def policy_config(self, policy_cfg: PolicyConfig) -> PolicyConfig:
        """``policy_cfg`` reading this stage's file as its frozen fleet backbone."""
        if policy_cfg.vision_backbone != FLEET:
            raise ValueError(
                f"the fleet encoder stage serves vision_backbone={FLEET!r}, "
                f"got {policy_cfg.vision_backbone!r}"
            )
        return replace(policy_cfg, backbone_weights=str(self.path))

    def due(self, policy_round: int) -> bool:
        """Whether a stage runs before policy round ``policy_round`` (round 0 always)."""
        every = self.cfg.refresh_every
        return policy_round == 0 or (every > 0 and policy_round % every == 0)

    def run(
        self, clients: Mapping[str, Any], data: Mapping[str, Sequence[Episode]]
    ) -> list[dict[str, Any]]:
        """``cfg.rounds`` encoder rounds over every robot, then the file rewritten; one report
        row per round (frames, loss, CPU seconds and bytes per robot)."""
        from fed_ros.learning.backbones.trunk import forget_frozen
        from fed_ros.learning.fleet_encoder import aggregate_encoders, save_backbone

        rows = []
        payload = int(sum(np.asarray(v).nbytes for v in self.state.values()))
        for _ in range(self.cfg.rounds):
            t0 = time.perf_counter()
            results = {
                rid: client.fit_encoder(self.state, self.cfg, data[rid], self.rounds_run)
                for rid, client in clients.items()
            }
            self.state = aggregate_encoders(list(results.values()))
            rows.append(
                {
                    "encoder_round": self.rounds_run,
                    "frames": {rid: res.num_samples for rid, res in results.items()},
                    "loss_first": float(
                        np.mean([r.metrics["loss_first"] for r in results.values()])
                    ),
                    "loss_last": float(np.mean([r.metrics["loss_last"] for r in results.values()])),
                    "cpu_s": {rid: res.metrics["cpu_s"] for rid, res in results.items()},
                    # float32 both ways: the encoder down, the robot's encoder up.
                    "bytes_per_robot": 2 * payload,
                    "wall_s": time.perf_counter() - t0,
                }
            )
            self.rounds_run += 1
        forget_frozen(self.path)  # policies built from now on read the new file
        save_backbone(self.state, self.path)
        return rows

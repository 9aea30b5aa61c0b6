"""The fleet encoder stage of `fed-ros bench federation`: every robot trains the shared visual
encoder on all its recorded frames (`RobotClient.fit_encoder`, the robot node's call) and the
server FedAvgs it across the whole fleet (`fleet_encoder.aggregate_encoders`), before the
policy rounds and again every ``refresh_every`` policy rounds.

A cell whose policy says ``vision_backbone="fleet"`` runs it (`federation.run.run_cell`); the
encoder file it writes is the ``backbone_weights`` every policy of the cell reads, frozen and
cached. Rewriting the file in place is what a refresh does: the frozen trunk is keyed by the
file's modification time and size, so the next policy built reads the new weights.

A stage is a pure function of the encoder config, the robots, their frames and the rounds run
before it (every robot's steps are seeded), and every method of a seed runs the same one. So
`EncoderStageStore` keeps each finished stage on disk and the other cells of the seed load it
instead of training it again; a cell's record says which stages it loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from fed_ros.core.data.episode import Episode
from fed_ros.learning.backbones.specs import FLEET
from fed_ros.learning.configuration_fleet_encoder import FleetEncoderConfig
from fed_ros.learning.configuration_policy import PolicyConfig


def stage_key(
    cfg: FleetEncoderConfig, data: Mapping[str, Sequence[Episode]], rounds_run: int
) -> str:
    """What determines one encoder stage, as a hex digest: the config, the rounds already run,
    and per robot (in order) its episodes' identity (task, variation, length, actions and
    first camera frames). The clients' seeds follow from the robot ids and ``cfg.seed``."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({"cfg": cfg.identity(), "rounds_run": rounds_run}, sort_keys=True).encode())
    for rid, episodes in data.items():
        h.update(f"|{rid}:{len(episodes)}".encode())
        for ep in episodes:
            h.update(f"|{ep.task}/{ep.variation}/{len(ep)}".encode())
            h.update(np.ascontiguousarray(ep.actions).tobytes())
            for cam in cfg.cameras:
                if cam in ep.observations:
                    h.update(np.ascontiguousarray(ep.observations[cam][0]).tobytes())
    return h.hexdigest()


class EncoderStageStore:
    """Finished encoder stages under ``root``: ``<key>.safetensors`` (the whole encoder state,
    trunk and objective heads, which a later stage continues from) and ``<key>.json`` (its
    report rows). Cells of one seed run side by side in worker processes, so a stage is
    computed under an exclusive file lock: the second cell waits for it, then loads it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def load(self, key: str) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]] | None:
        from safetensors.numpy import load_file

        tensors, rows = self.root / f"{key}.safetensors", self.root / f"{key}.json"
        if not (tensors.is_file() and rows.is_file()):
            return None
        return dict(load_file(str(tensors))), json.loads(rows.read_text())

    def store(self, key: str, state: Mapping[str, np.ndarray], rows: list[dict[str, Any]]) -> None:
        from safetensors.numpy import save_file

        # The rows last, each file replaced atomically: `load` sees a stage whole or not at all.
        tensors = {k: np.ascontiguousarray(v) for k, v in state.items()}
        with self._replacing(f"{key}.safetensors") as tmp:
            save_file(tensors, tmp)
        with self._replacing(f"{key}.json") as tmp:
            Path(tmp).write_text(json.dumps(rows))

    @contextlib.contextmanager
    def _replacing(self, name: str) -> Iterator[str]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        os.close(fd)
        try:
            yield tmp
            os.replace(tmp, self.root / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


class FleetEncoderStage:
    """The server's side of the encoder rounds: the current encoder, its file, its schedule."""

    def __init__(
        self, cfg: FleetEncoderConfig, path: str | Path, store: EncoderStageStore | None = None
    ) -> None:
        from fed_ros.learning.fleet_encoder import initial_encoder_state, save_backbone

        self.cfg = cfg
        self.store = store
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
        row per round (frames, loss, CPU seconds and bytes per robot). With a store, a stage
        another cell already ran is loaded; its rows then say ``"loaded": true`` and carry the
        CPU seconds the stage cost when it was computed."""
        from fed_ros.learning.backbones.trunk import forget_frozen
        from fed_ros.learning.fleet_encoder import save_backbone

        if self.store is None:
            rows = self._train(clients, data)
        else:
            key = stage_key(self.cfg, data, self.rounds_run)
            with self.store.locked(key):
                done = self.store.load(key)
                if done is None:
                    rows = self._train(clients, data)
                    self.store.store(key, self.state, rows)
                else:
                    self.state, rows = done
                    rows = [{**row, "loaded": True} for row in rows]
                    self.rounds_run += self.cfg.rounds
        forget_frozen(self.path)  # policies built from now on read the new file
        save_backbone(self.state, self.path)
        return rows

    def _train(
        self, clients: Mapping[str, Any], data: Mapping[str, Sequence[Episode]]
    ) -> list[dict[str, Any]]:
        from fed_ros.learning.fleet_encoder import aggregate_encoders

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
        return rows

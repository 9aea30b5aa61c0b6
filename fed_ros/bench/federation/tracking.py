"""The benchmark's cells in TensorBoard: one run per (setting, method, seed, encoding) cell under
``<out>/tb``, rebuilt from the cell records (cached cells included), so
``tensorboard --logdir runs`` shows benchmark cells beside the fleets' own runs."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fed_ros.bench.federation.wire import encoding_suffix
from fed_ros.bench.federation.settings import backbone_suffix
from fed_ros.learning.tracking import open_tracker

_ROUND_COLUMNS = {
    "loss_bc": "train/loss_bc",
    "update_bytes": "bytes/updates",
    "model_bytes": "bytes/models",
    "num_clusters": "clusters/count",
    "acc_intra": "clusters/accumulated_update_similarity_within_family",
    "acc_inter": "clusters/accumulated_update_similarity_across_families",
    "train_s": "time/train_s",
    "cluster_cpu_s": "time/cluster_cpu_s",
}


def cell_run_name(rec: Mapping[str, Any]) -> str:
    """``<setting>__<method>__s<seed>[__<encoding>][__<backbone>]``, as the cell files are
    named (`federation.run.CellSpec.key`)."""
    name = f"{rec['setting']}__{rec['method']}__s{rec['seed']}"
    profile = rec.get("profile") or {}
    encoding = profile.get("encoding", "float32")
    if encoding != "float32":
        name += f"__{encoding_suffix(encoding)}"
    return name + backbone_suffix(profile.get("policy") or {}, profile.get("fleet_encoder"))


def cell_scalars(rec: Mapping[str, Any]) -> dict[int, dict[str, float]]:
    """round -> scalars of one cell: its per-round columns and its evaluations."""
    out: dict[int, dict[str, float]] = {}
    for row in rec.get("rounds", []):
        values = out.setdefault(int(row["round"]), {})
        for column, tag in _ROUND_COLUMNS.items():
            if isinstance(row.get(column), (int, float)):
                values[tag] = float(row[column])
    # The fleet encoder's rounds, stepped by encoder round (their own tags).
    for row in rec.get("encoder_rounds", []):
        values = out.setdefault(int(row["encoder_round"]), {})
        values["encoder/loss_first"] = float(row["loss_first"])
        values["encoder/loss_last"] = float(row["loss_last"])
        values["encoder/bytes_per_robot"] = float(row["bytes_per_robot"])
        cpu = list(row["cpu_s"].values())
        values["encoder/cpu_s_per_robot"] = float(sum(cpu) / len(cpu))
    for ev in rec.get("evals", []):
        values = out.setdefault(int(ev["round"]), {})
        values["eval/success_mean"] = float(ev["mean"])
        for family, rate in (ev.get("per_family") or {}).items():
            values[f"eval/success/{family}"] = float(rate)
    return out


def track_cells(tb_dir: Path, cells: Sequence[Mapping[str, Any]], kind: str = "auto") -> int:
    """Write every finished cell as its own run (replacing an earlier write of it); returns how
    many were written (0 when tracking is off or not installed)."""
    written = 0
    for rec in cells:
        if rec.get("error") or not rec.get("rounds"):
            continue
        run_dir = Path(tb_dir) / cell_run_name(rec)
        shutil.rmtree(run_dir, ignore_errors=True)  # derived from the cell file: rewrite whole
        tracker = open_tracker(kind, run_dir, run_name=cell_run_name(rec))
        if tracker.kind == "none":
            return 0
        for round_idx, values in sorted(cell_scalars(rec).items()):
            tracker.scalars(values, round_idx)
        tracker.close()
        written += 1
    return written

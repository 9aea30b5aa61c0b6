"""The method-grid cells of `fed-ros bench federation`: which cells exist, and running them.

The cross/same/overlap experiments (and the image cells) are grids of (setting, method, seed)
cells. Each finished cell is one JSON file, so a rerun loads it instead of recomputing; the
missing ones are run by an executor: here in this process (`SerialExecutor`), side by side in
worker processes of the same command (`shards`), or as Ray tasks (`ray_tasks`),
each calling the one cell function `compute_cell`. A cell whose method fails is reported in its
record (not saved), not fatal. Scheduling and caching stand apart from the command's options and
report (`federation`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from tqdm.auto import tqdm

from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.federation.encoder import EncoderStageStore
from fed_ros.bench.federation.experiments import experiment_cells
from fed_ros.bench.federation.image import image_profile
from fed_ros.bench.federation.run import CellSpec, cell_path, run_cell, save_json
from fed_ros.bench.federation.settings import Profile

# The bench's one logger (also `demos`'), so its lines read as the command's.
log = logging.getLogger("fed_ros.bench.federation")


def compute_cell(
    spec: CellSpec, cache: DemoCache, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """One cell's record, as every executor runs it (in process, shard worker or Ray task).

    A method whose component is unavailable or misconfigured gives a record with ``error``
    (not fatal, so the rest of the table is still produced); anything else propagates.
    """
    # Encoder stages trained on the cached demos are kept beside them (`EncoderStageStore`).
    encoders = EncoderStageStore(cache.root.parent / "encoders")
    try:
        return run_cell(spec, cache, progress=progress, encoder_store=encoders)
    except (
        ValueError,
        ImportError,
        NotImplementedError,
        AttributeError,
        TypeError,
        KeyError,
    ) as exc:
        log.warning("cell %s failed: %s", spec.key, exc)
        return {
            "setting": spec.setting.name,
            "method": spec.method.name,
            "seed": spec.seed,
            "error": f"{type(exc).__name__}: {exc}",
            "rounds": [],
            "evals": [],
            "final": {},
        }


def store_cell(out: Path, spec: CellSpec, rec: dict[str, Any]) -> None:
    """Cache a finished cell; a failed one is not saved, so the next run retries it."""
    if not rec.get("error"):
        save_json(cell_path(out, spec), rec)


def prepare_demos(todo: Sequence[CellSpec], cache: DemoCache) -> None:
    """Generate the demos of every setting in ``todo`` once, before cells run side by side
    (workers then only read them: from disk, or from ``cache`` itself when it is shipped)."""
    for setting in {s.setting.name: s.setting for s in todo}.values():
        cache.robot_data(setting)


class CellExecutor(Protocol):
    """Runs cells that are not cached: serially here, in shard processes, or as Ray tasks."""

    def run(
        self, todo: Sequence[CellSpec], out: Path, cache: DemoCache, bar: Any
    ) -> dict[str, dict[str, Any]]:
        """Each cell's record by key, finished cells stored (`store_cell`), ``bar`` advanced."""
        ...


class SerialExecutor:
    """Every cell in this process, one after the other (``--jobs 1``, and each shard worker)."""

    def run(
        self, todo: Sequence[CellSpec], out: Path, cache: DemoCache, bar: Any
    ) -> dict[str, dict[str, Any]]:
        """Run the cells here, in order."""
        done = {}
        for spec in todo:
            bar.set_postfix_str(spec.key)
            done[spec.key] = rec = compute_cell(spec, cache, lambda s: bar.set_postfix_str(s))
            store_cell(out, spec, rec)
            bar.update(1)
        return done


def cell_specs(
    prof: Profile, experiments: Sequence[str], image_prof: Profile | None = None
) -> list[CellSpec]:
    """Every cell of the named experiments' method grids (`experiments.EXPERIMENTS`)."""
    return experiment_cells(prof, experiments, image_prof or image_profile())


def run_settings(
    prof: Profile,
    out: Path,
    cache: DemoCache,
    experiments: Sequence[str],
    force: bool,
    executor: CellExecutor | None = None,
    only_cells: set[str] | None = None,
    image_prof: Profile | None = None,
) -> list[dict[str, Any]]:
    """Cross/same-family method grids, the FeDepth overlap sweep and the image cells: cached
    cells are loaded, the rest run by ``executor`` (default: serially in this process)."""
    specs = cell_specs(prof, experiments, image_prof)
    if only_cells is not None:
        specs = [s for s in specs if s.key in only_cells]
    done: dict[str, dict[str, Any]] = {}
    todo: list[CellSpec] = []
    for spec in specs:
        path = cell_path(out, spec)
        if path.is_file() and not force:
            done[spec.key] = json.loads(path.read_text())
        else:
            todo.append(spec)
    with tqdm(total=len(specs), initial=len(done), desc="federation cells", unit="cell") as bar:
        done.update((executor or SerialExecutor()).run(todo, out, cache, bar))
    return [done[spec.key] for spec in specs]

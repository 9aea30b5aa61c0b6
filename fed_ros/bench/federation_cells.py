"""The method-grid cells of `fed-ros bench federation`: which cells exist, and running them.

The cross/same/overlap experiments (and the image cells) are grids of (setting, method, seed)
cells. Each finished cell is one JSON file, so a rerun loads it instead of recomputing; the
missing ones run here in this process or, side by side, in worker processes of the same command
restricted to their cells (results travel as the cells' JSON files, nothing is pickled). A cell
whose method fails is reported in its record (not saved), not fatal. Scheduling and caching stand
apart from the command's options and report (`federation`).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from fed_ros.bench.federation_demos import DemoCache
from fed_ros.bench.federation_methods import METHODS
from fed_ros.bench.federation_run import CellSpec, cell_path, run_cell, save_json
from fed_ros.bench.federation_settings import (
    Profile,
    cross_family,
    overlap_methods,
    overlap_setting,
    overlap_shift_setting,
    same_family,
)

# The bench's one logger (also `federation_demos`'), so its lines read as the command's.
log = logging.getLogger("fed_ros.bench.federation")


def _run_or_load(
    spec: CellSpec, out: Path, cache: DemoCache, force: bool, bar: Any
) -> dict[str, Any]:
    path = cell_path(out, spec)
    if path.is_file() and not force:
        bar.set_postfix_str(f"cached {spec.key}")
        return json.loads(path.read_text())
    bar.set_postfix_str(spec.key)
    try:
        rec = run_cell(spec, cache, progress=lambda s: bar.set_postfix_str(s))
    except (
        ValueError,
        ImportError,
        NotImplementedError,
        AttributeError,
        TypeError,
        KeyError,
    ) as exc:
        # A method whose component is unavailable or misconfigured is reported, not fatal,
        # so the rest of the table is still produced; the cell is not saved (retried later).
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
    save_json(path, rec)
    return rec


def cell_specs(
    prof: Profile, experiments: Sequence[str], image_prof: Profile | None = None
) -> list[CellSpec]:
    """Every cell of the cross/same/overlap (and image) experiments, seed by seed."""
    from fed_ros.bench.federation_image import image_cell_specs, image_profile

    specs: list[CellSpec] = (
        image_cell_specs(image_prof or image_profile()) if "image" in experiments else []
    )
    for seed in prof.seeds:
        if "cross" in experiments:
            specs += [
                CellSpec(cross_family(prof), METHODS[m], seed, prof) for m in prof.methods_cross
            ]
        if "same" in experiments:
            specs += [
                CellSpec(same_family(prof, seed=seed), METHODS[m], seed, prof)
                for m in prof.methods_same
            ]
        if "overlap" in experiments:
            # Both variants: conflicting (mirrored B) and pure covariate shift (unmirrored B).
            for ov in (overlap_setting(prof), overlap_shift_setting(prof)):
                specs += [CellSpec(ov, m, seed, prof) for m in overlap_methods(prof, ov)]
    return specs


def run_settings(
    prof: Profile,
    out: Path,
    cache: DemoCache,
    experiments: Sequence[str],
    force: bool,
    jobs: int = 1,
    worker_argv: Sequence[str] | None = None,
    only_cells: set[str] | None = None,
    image_prof: Profile | None = None,
) -> list[dict[str, Any]]:
    """Cross/same-family method grids, the FeDepth overlap sweep and the image cells."""
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
        if jobs <= 1 or len(todo) <= 1:
            for spec in todo:
                done[spec.key] = _run_or_load(spec, out, cache, True, bar)
                bar.update(1)
        else:
            # Demos are generated once here, so workers only read the cache.
            for setting in {s.setting.name: s.setting for s in todo}.values():
                cache.robot_data(setting)
            # Workers are plain subprocesses of this same command restricted to their cells:
            # results travel as the cells' JSON files, nothing is pickled between processes.
            shards = [todo[i::jobs] for i in range(jobs)]
            procs = []
            for shard in shards:
                if not shard:
                    continue
                cmd = [
                    sys.executable,
                    "-c",
                    "import sys; from fed_ros.bench.federation import main; "
                    "sys.exit(main(sys.argv[1:]))",
                    *(worker_argv or []),
                    "--jobs",
                    "1",
                    "--no-report",
                    "--cells",
                    ",".join(spec.key for spec in shard),
                ]
                procs.append(
                    subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
            pending = {spec.key: spec for spec in todo}
            while pending:
                for key in list(pending):
                    path = cell_path(out, pending[key])
                    if path.is_file():
                        done[key] = json.loads(path.read_text())
                        bar.set_postfix_str(f"done {key}")
                        bar.update(1)
                        del pending[key]
                if all(p.poll() is not None for p in procs):
                    for key, spec in pending.items():
                        # A worker reported it as failed (not saved): run it here to get the error.
                        done[key] = _run_or_load(spec, out, cache, True, bar)
                        bar.update(1)
                    pending = {}
                time.sleep(1.0)
    return [done[spec.key] for spec in specs]

"""The experiments of `fed-ros bench federation`, each declared once (issue 38 item 4).

An :class:`Experiment` says everything the command and its report need of it: the method-grid
cells it adds (every seed), the success tables it shows, its own run when it is not a grid of
cells (RND federations, the partition study), its claims lines and its report section. The
command, the cell grid (`cells.cell_specs`) and the report iterate :data:`EXPERIMENTS`; none
of them names an experiment. A new setting is one entry here, beside its own module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fed_ros.bench.federation import few
from fed_ros.bench.federation import report as R
from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.federation.image import (
    few_image_cell_specs,
    image_cell_specs,
    image_claims,
    image_section,
)
from fed_ros.bench.federation.methods import METHODS
from fed_ros.bench.federation.overlap import (
    OVERLAP_VARIANTS,
    overlap_claims,
    overlap_sweep_section,
    variant_methods,
    variant_overlaps,
)
from fed_ros.bench.federation.partition import partition_claims, partition_section, run_partition
from fed_ros.bench.federation.rnd import rnd_claims, rnd_section, run_rnd
from fed_ros.bench.federation.run import CellSpec
from fed_ros.bench.federation.settings import (
    Profile,
    cross_family,
    overlap_methods,
    overlap_setting,
    overlap_shift_setting,
    same_family,
)

log = logging.getLogger("fed_ros.bench.federation")

Groups = dict[tuple[str, str], list[dict[str, Any]]]
Tables = list[tuple[str, tuple[str, ...]]]


def _no_cells(prof: Profile, image_prof: Profile) -> list[CellSpec]:
    return []


def _no_tables(prof: Profile) -> Tables:
    return []


def _no_claims(g: Groups, result: Any, prof: Profile | None) -> list[str]:
    return []


def _no_section(
    out: Path, g: Groups, result: Any, prof: Profile, image_prof: Profile | None
) -> list[str]:
    return []


@dataclass(frozen=True)
class Experiment:
    """One experiment: what it runs and what the report says of it."""

    name: str
    help: str
    # Part of a run without --only (the camera and few-demos ones cost hours on 2 cores).
    default: bool = True
    # The method-grid cells it adds, every seed: (low-dim profile, image profile) -> cells.
    cells: Callable[[Profile, Profile], list[CellSpec]] = _no_cells
    # (setting, methods) of its success tables, in report order (a setting not run is skipped).
    tables: Callable[[Profile], Tables] = _no_tables
    # Its own run when it is not a grid of cells: (profile, out, demo cache, force) -> result.
    run: Callable[[Profile, Path, DemoCache, bool], Any] | None = None
    # Claims lines from the grouped cells and its run's result.
    claims: Callable[[Groups, Any, Profile | None], list[str]] = _no_claims
    # Report lines after every experiment's tables.
    section: Callable[[Path, Groups, Any, Profile, Profile | None], list[str]] = _no_section


# --------------------------------------------------------------------- cross and same


def _cross_cells(prof: Profile, image_prof: Profile) -> list[CellSpec]:
    return [
        CellSpec(cross_family(prof), METHODS[m], seed, prof)
        for seed in prof.seeds
        for m in prof.methods_cross
    ]


def _cross_claims(g: Groups, result: Any, prof: Profile | None) -> list[str]:
    """FedDRMan's claims on the cross-family fleet: +20 pp over FedAvg, the CUA ablation
    collapsing towards FedAvg, same-family robots clustered together."""

    def mean(m: str) -> float | None:
        return R.success_stats(g.get(("cross_family", m), []))["mean"]

    lines = []
    fa, fd, nc = mean("fedavg"), mean("feddrman"), mean("feddrman_no_cua")
    if fa is not None and fd is not None:
        ok = fd >= fa + 0.20
        lines.append(
            f"- Cross-family FedDRMan {100 * fd:.1f}% vs FedAvg {100 * fa:.1f}% "
            f"(+{100 * (fd - fa):.1f} pp; claim >= +20 pp): "
            f"{'REPRODUCED' if ok else 'NOT reproduced'}"
        )
    if nc is not None and fd is not None and fa is not None:
        ok = abs(nc - fa) < abs(nc - fd)
        lines.append(
            f"- FedDRMan without CUA {100 * nc:.1f}% (FedAvg {100 * fa:.1f}%, FedDRMan "
            f"{100 * fd:.1f}%): "
            f"{'collapses towards FedAvg' if ok else 'does NOT collapse towards FedAvg'}"
        )
    same, cross = R.coassign_stats(
        [c for c in g.get(("cross_family", "feddrman"), []) if not c.get("error")]
    )
    if same is not None and cross is not None:
        ok = same >= 0.95 and cross <= 0.05
        lines.append(
            f"- FedDRMan co-clustering: same-family pairs {100 * same:.0f}% of rounds "
            f"(claim >= 95%), cross-family {100 * cross:.0f}% (claim <= 5%): "
            f"{'REPRODUCED' if ok else 'NOT reproduced'}"
        )
    return lines


def _same_cells(prof: Profile, image_prof: Profile) -> list[CellSpec]:
    return [
        CellSpec(same_family(prof, seed=seed), METHODS[m], seed, prof)
        for seed in prof.seeds
        for m in prof.methods_same
    ]


# ------------------------------------------------------------------- few demos per arm


def _few_cells(prof: Profile, image_prof: Profile) -> list[CellSpec]:
    # Its own evaluation size: >= 20 rollouts per (model, family) and evaluation.
    profile = replace(prof, eval_episodes=prof.few_eval_episodes)
    setting = few.few_demos_setting(profile)
    return [
        CellSpec(setting, METHODS[m], seed, profile)
        for seed in prof.seeds
        for m in prof.methods_few
    ]


# ----------------------------------------------------------------------------- overlap


def _overlap_cells(prof: Profile, image_prof: Profile) -> list[CellSpec]:
    # Both variants: conflicting (mirrored B) and pure covariate shift (unmirrored B).
    return [
        CellSpec(ov, m, seed, prof)
        for seed in prof.seeds
        for ov in (overlap_setting(prof), overlap_shift_setting(prof))
        for m in overlap_methods(prof, ov)
    ]


def _overlap_tables(prof: Profile) -> Tables:
    return [(v, tuple(variant_methods(prof, v))) for v, _ in OVERLAP_VARIANTS]


def _overlap_sections(
    out: Path, g: Groups, result: Any, prof: Profile, image_prof: Profile | None
) -> list[str]:
    md: list[str] = []
    for setting, label in OVERLAP_VARIANTS:
        if any(s == setting for s, _ in g):
            md += overlap_sweep_section(out, g, setting, label, variant_overlaps(prof, setting))
    return md


# -------------------------------------------------------------- runs of their own (rnd, ...)


def _run_rnd(prof: Profile, out: Path, cache: DemoCache, force: bool) -> dict[str, Any] | None:
    """The RND experiment, or None (logged) when a component it needs is unavailable."""
    try:
        return run_rnd(prof, out, cache, force)
    except (ValueError, ImportError, AttributeError, TypeError) as exc:
        log.warning("RND experiment unavailable: %s", exc)
        return None


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "cross",
            "the cross-family fleet (conflicting families) x methods x seeds",
            cells=_cross_cells,
            tables=lambda prof: [("cross_family", prof.methods_cross)],
            claims=_cross_claims,
        ),
        Experiment(
            "same",
            "the same-family fleet (Lift variations, Dirichlet alpha=0.5) x methods x seeds",
            cells=_same_cells,
            tables=lambda prof: [("same_family", prof.methods_same)],
        ),
        Experiment(
            "overlap",
            "FeDepth's overlap sweep, both variants: overlap and overlap_shift",
            cells=_overlap_cells,
            tables=_overlap_tables,
            claims=lambda g, result, prof: overlap_claims(g, prof),
            section=_overlap_sections,
        ),
        Experiment(
            "rnd",
            "RND federations on clustered feature skew",
            run=_run_rnd,
            claims=lambda g, result, prof: rnd_claims(result, prof),
            section=lambda out, g, result, prof, iprof: rnd_section(out, result),
        ),
        Experiment(
            "partition",
            "loss vs alpha for embedding- vs task-based Dirichlet splits",
            run=run_partition,
            claims=lambda g, result, prof: partition_claims(result),
            section=lambda out, g, result, prof, iprof: partition_section(out, result),
        ),
        Experiment(
            "few",
            "9 robots with 4 demos each in three families",
            default=False,
            cells=_few_cells,
            tables=few.few_report_settings,
            claims=lambda g, result, prof: few.few_claims(g),
        ),
        Experiment(
            "image",
            "cross-family from cameras",
            default=False,
            cells=lambda prof, image_prof: image_cell_specs(image_prof),
            claims=lambda g, result, prof: image_claims(g),
            section=lambda out, g, result, prof, iprof: image_section(out, g, iprof),
        ),
        Experiment(
            "few_image",
            "the few-demos fleet from cameras, on the image profile's rounds and steps",
            default=False,
            cells=lambda prof, image_prof: few_image_cell_specs(image_prof, prof),
            tables=lambda prof: few.few_report_settings(prof, cameras=True),
            claims=lambda g, result, prof: few.few_claims(g, cameras=True),
        ),
    )
}
DEFAULT_EXPERIMENTS = tuple(name for name, e in EXPERIMENTS.items() if e.default)


def experiment_cells(prof: Profile, names: Sequence[str], image_prof: Profile) -> list[CellSpec]:
    """Every cell of the named experiments, in the registry's order."""
    return [
        spec
        for name, e in EXPERIMENTS.items()
        if name in names
        for spec in e.cells(prof, image_prof)
    ]


def run_experiments(
    prof: Profile, out: Path, cache: DemoCache, force: bool, names: Sequence[str]
) -> dict[str, Any]:
    """Each named experiment's own run (those that are not method grids): name -> result."""
    return {
        name: e.run(prof, out, cache, force)
        for name, e in EXPERIMENTS.items()
        if name in names and e.run is not None
    }


def claims(
    cells: Sequence[dict[str, Any]], results: dict[str, Any], prof: Profile | None
) -> list[str]:
    """Every experiment's claims lines, in the registry's order."""
    g = R.group_cells(cells)
    return [
        line for name, e in EXPERIMENTS.items() for line in e.claims(g, results.get(name), prof)
    ]

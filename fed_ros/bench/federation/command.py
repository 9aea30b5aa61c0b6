"""`fed-ros bench federation`: the seed papers' claims on MuJoCo arms, in-process (no ROS).

Experiments (each result cell is a JSON file under ``<out>/cells``; reruns skip finished
cells, ``--force`` recomputes):

* ``cross``: cross-family fleet (conflicting families) x methods x seeds -> success table,
  success-vs-round, co-assignment heat maps, update similarity (FedDRMan Fig. 5).
* ``same``: same-family fleet (Lift variations, Dirichlet alpha=0.5) x methods x seeds.
* ``overlap``: FeDepth overlap-ratio sweep on overlapping domains (soft vs hard), in two
  variants: ``overlap`` (domain B mirrored: input shift + conflicting actions) and
  ``overlap_shift`` (domain B not mirrored: pure covariate shift, FeDepth's setting).
* ``rnd``: RND federations on clustered feature skew: ARI vs the latent groups, novelty
  matrix, clustering compute vs IFCA's (ratio).
* ``partition``: loss vs alpha for embedding- vs task-based Dirichlet splits.
* ``image`` (only when named): cross-family FedDRMan / FedAvg / Local from the two cameras
  (`image`; camera demos cached under ``<out>/demos/*__cam84``).

Demonstrations come from the scripted experts without cameras and are cached as Episode
``.npz`` under ``<out>/demos``. Output: ``<out>/report.md``, ``<out>/*.png``.

This module is the command: options, profile, the experiments, the report. Which experiments
exist, their cells, tables, claims and report sections are declared once in `experiments`
(`EXPERIMENTS`), each beside its own module (`overlap`, `rnd`, `partition`, `few`, `image`);
the method-grid cells (which exist, cached, and the executors that run the rest) are in
`cells`, run side by side by `shards` (``--jobs``) or as Ray tasks by `ray_tasks` (``--ray``);
one cell's rounds in `run`, its demos in `demos` and rollouts in `evaluation`, fleets in
`settings`, methods in `methods`, tables and plots in `report`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from fed_ros.core.extras import INSTALL_COMMANDS, MissingExtra
from fed_ros.core.tracking import TRACKING_KINDS
from fed_ros.learning.backbones.specs import VISION_BACKBONES
from fed_ros.learning.configuration_fleet_encoder import OBJECTIVES
from fed_ros.bench.federation import report as R
from fed_ros.bench.federation.tracking import track_cells
from fed_ros.bench.federation.wire import check_bench_encoding
from fed_ros.bench.federation.cells import CellExecutor, SerialExecutor, run_settings
from fed_ros.bench.federation.demos import DemoCache
from fed_ros.bench.federation.experiments import (
    DEFAULT_EXPERIMENTS,
    EXPERIMENTS,
    claims,
    run_experiments,
)
from fed_ros.bench.federation.methods import METHODS
from fed_ros.bench.federation import few
from fed_ros.bench.federation.ray_tasks import LOCAL, RayExecutor, import_ray
from fed_ros.bench.federation.settings import (
    PROFILES,
    Profile,
    overlap_methods,
    overlap_shift_setting,
    with_overrides,
)

log = logging.getLogger("fed_ros.bench.federation")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fed-ros bench federation", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--quick", action="store_true", help="the <= 10 min profile (same as --profile quick)"
    )
    ap.add_argument("--profile", choices=sorted(PROFILES), default="default")
    ap.add_argument("--out", default="runs/bench_federation", help="output directory")
    ap.add_argument(
        "--only",
        nargs="+",
        choices=tuple(EXPERIMENTS),
        help="run only these experiments ("
        + "; ".join(f"{e.name}: {e.help}" for e in EXPERIMENTS.values())
        + "; "
        + ", ".join(n for n, e in EXPERIMENTS.items() if not e.default)
        + " are never part of the default run)",
    )
    ap.add_argument("--methods", nargs="+", help="override the method list (cross and same)")
    ap.add_argument("--robots", type=int, help="override K robots")
    ap.add_argument("--rounds", type=int, help="override rounds")
    ap.add_argument("--local-steps", type=int, help="override optimiser steps per robot per round")
    ap.add_argument("--demos", type=int, help="override demos per robot")
    ap.add_argument(
        "--eval-episodes", type=int, help="override closed-loop episodes per (model, family)"
    )
    few.add_arguments(ap)
    ap.add_argument(
        "--vision-backbone",
        choices=VISION_BACKBONES,
        help="image cells (image, few_image): the camera trunk; fleet: the fleet encoder stage "
        "(every robot, FedAvg) runs before the policy rounds; cells are keyed __<backbone>",
    )
    ap.add_argument("--encoder-rounds", type=int, help="fleet encoder: FedAvg rounds per stage")
    ap.add_argument(
        "--encoder-steps", type=int, help="fleet encoder: steps per robot per encoder round"
    )
    ap.add_argument(
        "--encoder-objective",
        choices=OBJECTIVES,
        help="fleet encoder: what it learns from frames (default proprio; cells of another "
        "objective are keyed __fleet_<objective>)",
    )
    ap.add_argument("--seeds", type=int, nargs="+", help="override seeds")
    ap.add_argument(
        "--overlaps",
        type=float,
        nargs="+",
        help="override the FeDepth target overlap ratios of the overlap sweep (each in [0, 1]); "
        "overlap_shift follows them only where the profile sets no overlap_shift_methods",
    )
    ap.add_argument("--force", action="store_true", help="recompute finished cells")
    ap.add_argument(
        "--jobs",
        type=int,
        help="cells run side by side in this many worker processes (default: min(2, cores)); "
        "with --ray and no address: the local Ray instance's CPUs (default: all cores)",
    )
    ap.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL,
        metavar="ADDRESS",
        help="run the cells as Ray tasks: on a fresh local Ray instance without ADDRESS, else on "
        "the Ray cluster at ADDRESS (auto, or HOST:PORT of `ray start --head`); needs "
        + INSTALL_COMMANDS["ray"],
    )
    ap.add_argument(
        "--encoding",
        type=_encoding,
        help="how updates and cluster models travel, UPDATE[/MODEL] (float32 exact; float16; "
        "int8; int8_block; int4_block; topk or topk:<fraction>: sparse update deltas; int8_delta, "
        "int4_delta: quantized, deflated update deltas; the deltas keep error feedback and "
        "send float32 models unless named, e.g. int4_block/float32): "
        "the robots train and are evaluated on decoded models, bytes per round are recorded",
    )
    ap.add_argument(
        "--tracking",
        choices=TRACKING_KINDS,
        default="auto",
        help="each cell's rounds as a TensorBoard (or MLflow) run under <out>/tb "
        "(auto: TensorBoard when installed)",
    )
    ap.add_argument("--cells", help=argparse.SUPPRESS)  # worker: comma-separated cell keys
    ap.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)
    return ap


def _encoding(name: str) -> str:
    """An --encoding value, UPDATE[/MODEL] (argparse names a bad one)."""
    try:
        return check_bench_encoding(name)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _profile(args: argparse.Namespace) -> Profile:
    base = PROFILES["quick" if args.quick else args.profile]
    prof = with_overrides(
        base,
        robots=args.robots,
        rounds=args.rounds,
        local_steps=args.local_steps,
        demos_per_robot=args.demos,
        eval_episodes=args.eval_episodes,
        **few.few_overrides(args),
        seeds=tuple(args.seeds) if args.seeds else None,
        overlaps=tuple(args.overlaps) if args.overlaps else None,
        encoding=args.encoding,
    )
    bad = [o for o in prof.overlaps if not 0.0 <= o <= 1.0]
    if bad:
        raise ValueError(f"--overlaps must be in [0, 1], got {bad}")
    if args.methods:
        unknown = [m for m in args.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}; known: {sorted(METHODS)}")
        prof = with_overrides(
            prof,
            methods_cross=tuple(args.methods),
            methods_same=tuple(args.methods),
            methods_few=tuple(args.methods),
        )
    overlap_methods(prof, overlap_shift_setting(prof))  # validates overlap_shift_methods
    few.few_demos_setting(prof)  # validates the few-demos sizes
    if prof.robots < 2:
        raise ValueError(f"--robots must be >= 2, got {prof.robots}")
    if (
        prof.rounds < 1
        or prof.local_steps < 1
        or prof.eval_episodes < 1
        or prof.demos_per_robot < 2
    ):
        raise ValueError(
            f"rounds/local-steps/eval-episodes must be >= 1 and demos >= 2, got {prof}"
        )
    return prof


def _executor(args: argparse.Namespace, worker_argv: Sequence[str]) -> CellExecutor:
    """Who runs the cells still to run: Ray tasks (--ray), worker processes, or this process."""
    if args.ray is not None:
        import_ray()  # a missing extra is one clear line before any work, not a late trace
        return RayExecutor(args.ray, num_cpus=args.jobs)
    from fed_ros.bench.federation.shards import ShardExecutor

    jobs = args.jobs if args.jobs is not None else min(2, os.cpu_count() or 1)
    return ShardExecutor(jobs, worker_argv) if jobs > 1 else SerialExecutor()


def write_report(
    prof: Profile,
    out: Path,
    cells: list[dict[str, Any]],
    results: dict[str, Any],
    wall_s: float,
    cpu_s: float | None = None,
    image_prof: Profile | None = None,
) -> Path:
    """report.md with the tables, claims and plot links; PNGs next to it. ``results``: the
    runs of the experiments that are not method grids, by name (`run_experiments`)."""
    g = R.group_cells(cells)
    md = [
        f"# fed-ros bench federation — profile `{prof.name}`",
        "",
        f"K={prof.robots} robots, {prof.rounds} rounds x {prof.local_steps} local steps, "
        f"{prof.demos_per_robot} demos/robot, {prof.eval_episodes} seeded rollouts per "
        f"(model, family), seeds {list(prof.seeds)}; low-dim GMM policy "
        f"{prof.policy_config().to_dict()['embed_dim']}-d; "
        f"this invocation: wall {wall_s:.0f} s"
        + (f", CPU {cpu_s:.0f} s" if cpu_s is not None else "")
        + f"; CPU time summed over the cells in the tables: "
        f"{sum(c.get('cpu_s', 0.0) for c in cells):.0f} s (cached cells cost nothing on a rerun).",
        "",
        "## Claims",
        "",
    ]
    md += claims(cells, results, prof) or ["- (no claim cells ran)"]
    tables = [t for e in EXPERIMENTS.values() for t in e.tables(prof)]
    for setting, methods in tables:
        if not any(s == setting for s, _ in g):
            continue
        md += [
            "",
            f"## {setting}: success rate (%) per family, mean ± std over seeds",
            "",
            R.method_table(setting, g, methods),
        ]
        png = R.plot_success_vs_round(out / f"{setting}_success_vs_round.png", setting, g, methods)
        md += ["", f"![success vs round]({png.name})"]
        for m in ("feddrman", "ifca", "rnd", "fedepth_soft", "fedepth_ov020", "feddrman_no_cua"):
            cells_m = [c for c in g.get((setting, m), []) if not c.get("error") and c.get("rounds")]
            if cells_m and cells_m[0]["rounds"][0].get("coassign"):
                png = R.plot_coassignment(out / f"{setting}_{m}_coassignment.png", cells_m[0])
                md += [f"![{m} co-assignment]({png.name})"]
        sim_cells = [
            c
            for m in ("fedavg", "feddrman")
            for c in g.get((setting, m), [])[:1]
            if not c.get("error") and c.get("rounds")
        ]
        if sim_cells:
            png = R.plot_update_similarity(out / f"{setting}_update_similarity.png", sim_cells)
            md += [f"![update similarity]({png.name})"]
    for name, e in EXPERIMENTS.items():
        md += e.section(out, g, results.get(name), prof, image_prof)
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fed-ros bench federation`; returns the exit code."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    torch.set_num_threads(1)  # small models: threads only add contention on a shared machine
    try:
        prof = _profile(args)
    except ValueError as exc:
        print(f"fed-ros bench federation: error: {exc}", file=sys.stderr)
        return 2
    experiments = tuple(args.only or DEFAULT_EXPERIMENTS)
    from fed_ros.bench.federation.image import image_profile

    try:
        iprof = image_profile(args)
    except ValueError as exc:
        print(f"fed-ros bench federation: error: {exc}", file=sys.stderr)
        return 2
    if args.jobs is not None and args.jobs < 1:
        print(
            f"fed-ros bench federation: error: --jobs must be >= 1, got {args.jobs}",
            file=sys.stderr,
        )
        return 2
    raw_argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        executor = _executor(args, raw_argv)
    except MissingExtra as exc:  # checked before anything is written under --out
        print(f"fed-ros bench federation: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = DemoCache(out / "demos", noise_std=prof.noise_std)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    if args.cells is not None:
        # Worker mode: run exactly these cells, no other experiment, no report.
        run_settings(
            prof,
            out,
            cache,
            experiments,
            args.force,
            SerialExecutor(),
            only_cells=set(args.cells.split(",")),
            image_prof=iprof,
        )
        return 0
    cells = run_settings(prof, out, cache, experiments, args.force, executor, image_prof=iprof)
    try:
        tracked = track_cells(out / "tb", cells, args.tracking)
    except MissingExtra as err:  # asked for by name: one line, the report still comes
        log.warning("tracking off: %s", err)
    else:
        if tracked:
            print(f"{tracked} cell(s) in TensorBoard: tensorboard --logdir {out / 'tb'}")
    results = run_experiments(prof, out, cache, args.force, experiments)
    report = write_report(
        prof,
        out,
        cells,
        results,
        time.perf_counter() - t0,
        time.process_time() - cpu0,
        image_prof=iprof,
    )
    print(report.read_text())
    print(f"report: {report}")
    return 0

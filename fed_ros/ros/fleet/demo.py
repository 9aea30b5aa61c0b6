"""`fed-ros demo` (what `make demo` runs): a small simulated fleet, end to end over ROS 2.

Starts config/fleet_demo.yaml with `fed-ros up`'s process manager (server, 4 MuJoCo
bridges, 4 robot nodes in 2 task families), lets each robot record its demonstrations
with the scripted expert over ROS, runs the configured rounds of FedDRMan with a
closed-loop evaluation after every round, prints a per-round table (cluster assignment
and success per robot/task) and writes plots and a JSON report under runs/demo/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from fed_ros.ros.fleet.launcher import start_fleet
from fed_ros.ros.fleet.fleet_file import (
    DEMO_FLEET_FILE,
    IMAGE_DEMO_FLEET_FILE,
    default_fleet_file,
    load_fleet_config,
)
from fed_ros.ros.fleet.plan import FleetConfig
from fed_ros.core.rounds.report import robot_report_cells


def format_round_table(report: dict[str, Any], tasks: dict[str, tuple[str, ...]]) -> str:
    """One round of the demo table: cluster, success and loss per robot/task."""
    head = (
        f"round {report['round']}: {report['status']} | updates {report['updates_accepted']}/"
        f"{report['updates_received']} | aggregation {report['aggregation_seconds']:.2f} s"
    )
    lines = [head, f"  {'robot':<10} {'task':<20} {'cluster':>7} {'success':>8} {'bc_loss':>8}"]
    for r in report["robots"]:
        success, loss, clusters = robot_report_cells(r)
        lines.append(
            f"  {r['robot_id']:<10} {'+'.join(tasks.get(r['robot_id'], ())):<20} {clusters:>7} "
            f"{success:>8} {loss:>8}"
        )
    for c in report["clusters"]:
        lines.append(
            f"  cluster {c['cluster_id']}: {', '.join(c['members'])} (members' update cosine "
            f"{c['intra_similarity']:.2f})"
        )
    return "\n".join(lines)


def _success_by_round(
    reports: list[dict[str, Any]],
) -> list[tuple[int, dict[str, float], dict[str, list[int]]]]:
    """(round, {robot: success}, {robot: clusters}) of every completed round with an evaluation."""
    out = []
    for rep in reports:
        if not rep["completed"]:
            continue
        rates = {
            r["robot_id"]: r["success_rate"]
            for r in rep["robots"]
            if not math.isnan(r["success_rate"])
        }
        if rates:
            out.append(
                (rep["round"], rates, {r["robot_id"]: r["cluster_ids"] for r in rep["robots"]})
            )
    return out


def family_labels(config: FleetConfig) -> dict[str, tuple[str, ...]]:
    """Robot id -> its task family labels: the task, plus ``/<variation>`` for a non-default
    variation (a mirrored-mount Lift arm is another family than a normal one)."""
    return {
        r.robot_id: tuple(t if r.variation == "default" else f"{t}/{r.variation}" for t in r.tasks)
        for r in config.robots
    }


def final_success_by_task(
    reports: list[dict[str, Any]], tasks: dict[str, tuple[str, ...]]
) -> dict[str, float]:
    """{task family: mean success of its robots at the last evaluated round} ({} when none)."""
    evaluated = _success_by_round(reports)
    if not evaluated:
        return {}
    rates = evaluated[-1][1]
    out: dict[str, list[float]] = {}
    for rid, value in rates.items():
        out.setdefault("+".join(tasks.get(rid, ())), []).append(value)
    return {fam: sum(v) / len(v) for fam, v in sorted(out.items())}


def format_summary(reports: list[dict[str, Any]], tasks: dict[str, tuple[str, ...]]) -> str:
    """Success of every robot after each evaluated round.

    Also per-task means, and clusters vs task families.
    """
    evaluated = _success_by_round(reports)
    if not evaluated:
        return "summary: no evaluated round completed"
    robots = list(tasks)
    families = sorted({"+".join(t) for t in tasks.values()})
    family_of = {rid: "+".join(t) for rid, t in tasks.items()}
    width = max(8, *(len(x) for x in robots + families))
    row1 = [rid.ljust(width) for rid in robots] + ["mean".ljust(width)] * len(families) + ["mean"]
    row2 = (
        [family_of[rid].ljust(width) for rid in robots]
        + [f.ljust(width) for f in families]
        + ["all"]
    )
    lines = [
        "success rate after each evaluated round [cluster]:",
        f"{'round':>5} | " + " | ".join(row1),
        f"{'':>5} | " + " | ".join(row2),
    ]
    lines.append("-" * len(lines[-1]))

    def family_means(rates: dict[str, float]) -> dict[str, float]:
        out = {}
        for fam in families:
            vals = [v for rid, v in rates.items() if family_of.get(rid) == fam]
            out[fam] = sum(vals) / len(vals) if vals else math.nan
        return out

    for rnd, rates, clusters in evaluated:
        cells = []
        for rid in robots:
            cid = ",".join(str(c) for c in clusters.get(rid, [])) or "-"
            cells.append(
                (f"{rates[rid]:.2f} [{cid}]" if rid in rates else f"- [{cid}]").ljust(width)
            )
        fam = family_means(rates)
        cells += [f"{fam[f]:.2f}".ljust(width) for f in families]
        lines.append(
            f"{rnd:>5} | " + " | ".join(cells) + f" | {sum(rates.values()) / len(rates):.2f}"
        )
    (r0, first, _), (r1, last, clusters) = evaluated[0], evaluated[-1]
    f0, f1 = family_means(first), family_means(last)
    per_family = ", ".join(f"{f} {f0[f]:.2f} -> {f1[f]:.2f}" for f in families)
    lines.append(
        f"mean success: round {r0} {sum(first.values()) / len(first):.2f} -> round {r1} "
        f"{sum(last.values()) / len(last):.2f} ({per_family})"
    )
    groups: dict[int, list[str]] = {}
    for rid in robots:
        for cid in clusters.get(rid, []):
            groups.setdefault(cid, []).append(rid)
    found = "; ".join(f"cluster {cid}: {', '.join(m)}" for cid, m in sorted(groups.items()))
    pure = all(len({family_of[m] for m in members}) == 1 for members in groups.values())
    whole = all(len({cid for cid, m in groups.items() if rid in m}) <= 1 for rid in robots) and len(
        groups
    ) == len(families)
    verdict = (
        "each task family is one cluster"
        if pure and whole
        else "clusters are single-family but a family is split"
        if pure
        else "clusters MIX task families"
    )
    lines.append(f"clusters found: {found} ({verdict})")
    return "\n".join(lines)


def write_plots(reports: list[dict[str, Any]], config: FleetConfig, out_dir: Path) -> list[Path]:
    """Success per robot vs round, cluster assignments over rounds, local BC loss (PNG, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    done = [r for r in reports if r["completed"]]
    if not done:
        return []
    robots = config.robot_ids
    rounds = [r["round"] for r in done]
    task_of = family_labels(config)
    families = sorted(set(task_of.values()))
    colours = {fam: plt.cm.tab10(i) for i, fam in enumerate(families)}
    paths = []

    def values(key):
        out = np.full((len(robots), len(done)), np.nan)
        for j, rep in enumerate(done):
            for line in rep["robots"]:
                if line["robot_id"] in robots:
                    out[robots.index(line["robot_id"]), j] = line[key]
        return out

    for key, name, ylabel in (
        ("success_rate", "success_per_round.png", "closed-loop success rate"),
        ("train_loss", "train_loss_per_round.png", "local BC loss (NLL)"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        data = values(key)
        success = key == "success_rate"
        for i, rid in enumerate(robots):
            keep = ~np.isnan(data[i])  # rounds without an evaluation are skipped, not gaps
            # Success rates of robots often coincide: a small per-robot offset keeps every line
            # visible.
            shift = (i - (len(robots) - 1) / 2) * 0.012 if success else 0.0
            ax.plot(
                np.asarray(rounds)[keep],
                data[i][keep] + shift,
                marker="os^vDP"[i % 6],
                color=colours[task_of[rid]],
                linestyle="-" if i % 2 == 0 else "--",
                label=f"{rid} ({'+'.join(task_of[rid])})",
            )
        if success:
            ax.set_ylim(-0.06, 1.06)
        ax.set_xticks(rounds)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{config.algorithm}: {ylabel}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
        plt.close(fig)
        paths.append(out_dir / name)

    clusters = np.full((len(robots), len(done)), -1.0)
    for j, rep in enumerate(done):
        for line in rep["robots"]:
            if line["robot_id"] in robots and line["cluster_ids"]:
                clusters[robots.index(line["robot_id"]), j] = line["cluster_ids"][0]
    fig, ax = plt.subplots(figsize=(6, 3))
    im = ax.imshow(clusters, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(robots)), [f"{r} ({'+'.join(task_of[r])})" for r in robots], fontsize=7)
    ax.set_xticks(range(len(done)), [str(r) for r in rounds])
    ax.set_xlabel("round")
    ax.set_title("cluster assignment after each round")
    for (i, j), cid in np.ndenumerate(clusters):
        ax.text(
            j,
            i,
            "-" if cid < 0 else str(int(cid)),
            ha="center",
            va="center",
            fontsize=8,
            color="k" if im.norm(cid) > 0.5 else "w",
        )  # viridis is bright at the top
    ids = sorted({int(c) for c in clusters.ravel() if c >= 0})
    fig.colorbar(im, ax=ax, label="cluster id", ticks=ids or None)
    fig.tight_layout()
    fig.savefig(out_dir / "clusters.png", dpi=120)
    plt.close(fig)
    paths.append(out_dir / "clusters.png")
    return paths


def demo_config(
    fleet: str | None, policy: str | None, rounds: int | None, run_dir: str | None
) -> FleetConfig:
    """The fleet `fed-ros demo` runs: ``fleet`` (default: the demo fleet; with ``policy`` image,
    the image demo fleet, whose data and schedule are what learning from pixels needs, not the
    low-dim one with cameras switched on) with the command line's overrides."""
    name = IMAGE_DEMO_FLEET_FILE if policy == "image" else DEMO_FLEET_FILE
    config = load_fleet_config(fleet or default_fleet_file(name=name))
    return dataclasses.replace(
        config,
        run_dir=str(run_dir or config.run_dir),
        **({"rounds": rounds} if rounds is not None else {}),
        **({"policy": policy} if policy is not None else {}),
    )


def run_demo(argv: list[str]) -> int:
    """Run the demo fleet to the end; 0 when every round completed."""
    parser = argparse.ArgumentParser(prog="fed-ros demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fleet", default=None, help="fleet config (default: config/fleet_demo.yaml)"
    )
    parser.add_argument(
        "--run-dir", default=None, help="output directory (default: the fleet's run_dir)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    parser.add_argument(
        "--policy",
        choices=("lowdim", "image"),
        default=None,
        help="override the fleet's policy: image = learn from the two 84x84 cameras (without "
        "--fleet: config/fleet_demo_image.yaml)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="give up after this many seconds (default: 1800, 3600 with the image policy)",
    )
    parser.add_argument(
        "--keep-demos",
        action="store_true",
        help="reuse demonstrations recorded by a previous run (default: start fresh)",
    )
    args = parser.parse_args(argv)
    try:
        config = demo_config(args.fleet, args.policy, args.rounds, args.run_dir)
        run_dir = Path(config.run_dir)
    except ValueError as exc:
        print(f"fed-ros demo: {exc}", file=sys.stderr)
        return 2
    if run_dir.exists():
        # A fresh federation each run (the server would otherwise resume the last one).
        shutil.rmtree(run_dir / "server", ignore_errors=True)
        if not args.keep_demos:
            for robot in config.robot_ids:
                shutil.rmtree(run_dir / robot, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    domain = random.SystemRandom().randint(1, 101)
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    tasks = family_labels(config)
    print(
        f"fed-ros demo: {len(config.robots)} simulated robots "
        f"({', '.join(rid + ': ' + '+'.join(t) for rid, t in tasks.items())}), {config.algorithm}, "
        f"{config.rounds} rounds, ROS_DOMAIN_ID={domain}; logs in {run_dir / 'logs'}"
    )
    print(
        "  robots record expert demonstrations over ROS, then federate; "
        f"about {10 if config.policy == 'lowdim' else 30} min on 2 cores..."
    )
    timeout = args.timeout or (1800.0 if config.policy == "lowdim" else 3600.0)

    from fed_ros.ros.operator.monitor import FleetMonitor

    t0 = time.monotonic()
    fleet = start_fleet(config, run_dir, domain)
    code = 1
    reports: list[dict[str, Any]] = []
    try:
        with FleetMonitor(track_models=False) as monitor:
            printed = 0
            while time.monotonic() - t0 < timeout:
                monitor.spin_once(0.5)
                for (
                    line
                ) in fleet.progress.poll():  # demonstrations, training, rounds: see LogFollower
                    print(f"  {line}", flush=True)
                while printed < len(monitor.reports):
                    report = monitor.reports[printed]
                    printed += 1
                    print(format_round_table(report, tasks), flush=True)
                dead = fleet.dead()
                if dead:
                    print(
                        f"fed-ros demo: node(s) died: {dead}; see {run_dir / 'logs'}",
                        file=sys.stderr,
                    )
                    break
                ann = monitor.announcement
                if (
                    ann is not None
                    and ann["stage"] == "done"
                    and any(
                        r["round"] == config.rounds - 1 and r["completed"] for r in monitor.reports
                    )
                ):
                    code = 0
                    break
            else:
                print(f"fed-ros demo: timed out after {timeout:.0f} s", file=sys.stderr)
            reports = list(monitor.reports)
    finally:
        fleet.stop()
    elapsed = time.monotonic() - t0
    (run_dir / "report.json").write_text(
        json.dumps(
            {
                "config": {"algorithm": config.algorithm, "rounds": config.rounds, "robots": tasks},
                "policy": config.policy,
                "elapsed_s": elapsed,
                "final_success_by_task": final_success_by_task(reports, tasks),
                "reports": reports,
            },
            indent=1,
            default=str,
        )
    )
    plots = write_plots(reports, config, run_dir)
    completed = sum(r["completed"] for r in reports)
    print(
        f"fed-ros demo: {completed}/{config.rounds} rounds completed in {elapsed / 60:.1f} min; "
        f"report {run_dir / 'report.json'}; plots: {', '.join(str(p) for p in plots) or 'none'}"
    )
    if reports:
        print(format_summary(reports, tasks))
    return code

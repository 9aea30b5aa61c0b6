"""The report of `fed-ros bench async` (`fed_ros.bench.federation.asynchronous`): per (method, round
mode), the final success over seeds with its Wilson interval, the virtual time each seed took to
reach a target success, how often the server aggregated, the stale updates it used, and the mean
success curve at the shared evaluation instants."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from fed_ros.bench.federation.report import wilson


def time_to_target(evals: Sequence[dict[str, Any]], target: float) -> float | None:
    """The first evaluation instant whose mean success reached ``target`` (None: never)."""
    for ev in evals:
        if ev["mean"] >= target:
            return float(ev["t"])
    return None


def report_rows(cells: Sequence[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """Per (method, mode): final success over seeds with its interval, the time to reach the
    target per seed, aggregations, stale updates used, fits of the slow robot."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["method"], cell["mode"]), []).append(cell)
    rows = []
    for (method, mode), group in sorted(groups.items()):
        k = n = 0
        for cell in group:
            final = cell["final"]
            k += round(final["mean"] * final["rollouts"])
            n += final["rollouts"]
        lo, hi = wilson(k, n)
        unit_s = statistics.median(c["fast_round_cpu_s"] for c in group)
        rows.append(
            {
                "method": method,
                "mode": mode,
                "seeds": len(group),
                "final": k / n if n else math.nan,
                "interval": (lo, hi),
                "successes": (k, n),
                "time_to_target": [time_to_target(c["evals"], target) for c in group],
                "aggregations": statistics.mean(len(c["rounds"]) for c in group),
                "stale_used": sum(
                    r["buffered"].get("buffered/stale_updates", 0.0)
                    for c in group
                    for r in c["rounds"]
                ),
                "slow_fits": statistics.mean(c["fits"][c["slow_robot"]] for c in group),
                "unit_s": unit_s,
                "curve": _mean_curve(group),
            }
        )
    return rows


def _mean_curve(group: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    by_t: dict[float, list[float]] = {}
    for cell in group:
        for ev in cell["evals"]:
            by_t.setdefault(float(ev["t"]), []).append(float(ev["mean"]))
    return [(t, statistics.mean(v)) for t, v in sorted(by_t.items())]


def format_report(rows: Sequence[dict[str, Any]], target: float, slow_factor: float) -> str:
    """The markdown table (and the mean success curves) of `report_rows`."""
    lines = [
        f"Success at equal virtual time, one robot {slow_factor:g}x slower; a time unit is one "
        "local round of a fast robot (its median CPU seconds in brackets).",
        "",
        f"| method | rounds | seeds | final success | 95 % interval | time to mean success >= "
        f"{target:g} (per seed) | aggregations | stale updates used | slow robot's local rounds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        times = ", ".join(
            "never" if t is None else f"{t:g} ({t * r['unit_s']:.1f} s)"
            for t in r["time_to_target"]
        )
        k, n = r["successes"]
        lines.append(
            f"| {r['method']} | {r['mode']} | {r['seeds']} | {k}/{n} = {r['final']:.2f} | "
            f"{r['interval'][0]:.2f}-{r['interval'][1]:.2f} | {times} | "
            f"{r['aggregations']:.1f} | {r['stale_used']:.0f} | {r['slow_fits']:.1f} |"
        )
    lines += ["", "Mean success over seeds at each evaluation instant (virtual time units):", ""]
    for r in rows:
        curve = "  ".join(f"t={t:g}: {m:.2f}" for t, m in r["curve"])
        lines.append(f"- {r['method']} {r['mode']}: {curve}")
    return "\n".join(lines)

"""What `fed-ros bench fleet-scale` measured and how it is shown: one round's record
(``ScaleRun``), the cost-growth table with its fitted exponents, the plot, the re-send jitter
comparison and the fault summary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class ScaleRun:
    """One round of the real server against ``robots`` virtual robots."""

    robots: int
    policy: str
    encoding: str
    channel: str
    faults: bool
    completed: bool
    round_s: float
    send_s: float  # announcement -> the last update left its process (robots' side)
    prepared_used: int  # updates encoded before the round (the rest were encoded in it)
    resent: int  # whole updates sent again (no acknowledgement: the robots' retry schedule)
    chunks_resent: int  # update chunks sent again on the server's request
    server_cpu_s: float
    server_peak_rss_mb: float
    bytes_out: int
    bytes_in: int
    updates_received: int
    updates_accepted: int
    updates_rejected: int
    aggregation_s: float
    cpu_per_update_ms: float
    ari: float
    load_average: float
    robots_delivered: int  # robots whose process assembled every new cluster model, same digests
    robot_digests: dict[str, str] = field(default_factory=dict)  # robot -> its cluster's model
    rejected_codes: dict[str, str] = field(default_factory=dict)  # robot -> server's reject code
    accepted_robots: list[str] = field(default_factory=list)  # robots the server acked accepted
    storm_calls: int = 0
    storm_accepted: int = 0
    # The robots' re-send spread (nodes.robot.uplink.UPDATE_RESEND_JITTER).
    retry_jitter: float = 0.5
    # Peaks of the server's RssAnon (its heap: what it owns) and RssFile (mapped file pages:
    # the spilled updates, which the kernel writes back and drops under pressure), sampled
    # every 0.2 s; server_peak_rss_mb (VmHWM) counts both.
    server_peak_anon_mb: float = 0.0
    server_peak_file_mb: float = 0.0

    @property
    def tail_s(self) -> float:
        """From the last update sent to the last model delivered: the server's part of a round."""
        return self.round_s - self.send_s


def fitted_exponent(ns: list[int], values: list[float]) -> float:
    """Log-log slope of ``values`` against ``ns`` (least squares); NaN with fewer than 2."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v > 0]
    if len({x for x, _ in pts}) < 2:  # e.g. --faults: one N twice
        return math.nan
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


COLUMNS = (
    ("robots", "N", "{:d}"),
    ("round_s", "round s", "{:.1f}"),
    ("send_s", "send s", "{:.1f}"),
    ("tail_s", "tail s", "{:.1f}"),
    ("server_cpu_s", "srv CPU s", "{:.1f}"),
    ("server_peak_rss_mb", "srv RSS MB", "{:.0f}"),
    ("server_peak_anon_mb", "anon MB", "{:.0f}"),
    ("bytes_out", "MB out", None),
    ("bytes_in", "MB in", None),
    ("cpu_per_update_ms", "ms/upd", "{:.1f}"),
    ("aggregation_s", "agg s", "{:.2f}"),
    ("ari", "ARI", "{:.2f}"),
    ("resent", "resent", "{:d}"),
    ("load_average", "load", "{:.1f}"),
)


def format_table(runs: list[ScaleRun]) -> str:
    """The cost-growth table of one policy/encoding, with the fitted exponents."""
    head = " | ".join(title for _, title, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for run in runs:
        cells = []
        for key, _, fmt in COLUMNS:
            value = getattr(run, key)
            cells.append(f"{value / 1e6:.1f}" if fmt is None else fmt.format(value))
        lines.append(" | ".join(cells))
    ns = [r.robots for r in runs]
    for key in ("round_s", "tail_s", "server_cpu_s", "aggregation_s"):
        slope = fitted_exponent(ns, [getattr(r, key) for r in runs])
        lines.append(f"fitted exponent of {key} vs N (log-log slope): {slope:.2f}")
    return "\n".join(lines)


def jitter_comparison(groups: dict[str, list[ScaleRun]]) -> str:
    """Round time and re-sends of each N, per re-send jitter, side by side with the ratio to the
    first jitter's run (``--retry-jitters 0 0.5``: the deterministic schedule against the
    robot node's)."""
    by_config: dict[str, dict[float, list[ScaleRun]]] = {}
    for runs in groups.values():
        for run in runs:
            key = f"{run.policy} {run.encoding} {run.channel}"
            by_config.setdefault(key, {}).setdefault(run.retry_jitter, []).append(run)
    lines = []
    for key, per_jitter in by_config.items():
        jitters = list(per_jitter)
        base = {r.robots: r for r in per_jitter[jitters[0]]}
        lines.append(f"{key}: re-send jitter side by side (ratio to jitter {jitters[0]:g})")
        lines.append("N | jitter | round s | ratio | re-sent | server CPU s")
        for jitter in jitters:
            for run in per_jitter[jitter]:
                ratio = run.round_s / base[run.robots].round_s if run.robots in base else math.nan
                lines.append(
                    f"{run.robots} | {jitter:g} | {run.round_s:.1f} | {ratio:.2f} | "
                    f"{run.resent} | {run.server_cpu_s:.2f}"
                )
    return "\n".join(lines)


def write_plot(groups: dict[str, list[ScaleRun]], path: Path) -> None:
    """Round time, server CPU and peak RSS against N (log-log), one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for label, runs in groups.items():
        ns = [r.robots for r in runs]
        for ax, key in zip(axes, ("round_s", "server_cpu_s", "server_peak_rss_mb")):
            ax.plot(ns, [getattr(r, key) for r in runs], "o-", label=label)
    for ax, title in zip(axes, ("round wall time (s)", "server CPU (s)", "server peak RSS (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("virtual robots N")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fault_summary(faulty: ScaleRun, clean: ScaleRun, differ: list[str]) -> str:
    """One line: completed, the reject codes, the storm, honest models that differ."""
    codes = sorted(set(faulty.rejected_codes.values()))
    return (
        f"completed {faulty.completed}; rejected {codes}; storm re-registrations accepted "
        f"{faulty.storm_accepted}/{faulty.storm_calls}; honest models differing: "
        f"{len(differ)} of {len(clean.robot_digests)}"
    )

"""Tables (markdown) and plots (PNG, matplotlib Agg) of `fed-ros bench federation`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95 % interval of a success rate."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    d = 1 + z * z / n
    c = p + z * z / (2 * n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, (c - h) / d), min(1.0, (c + h) / d))


def _fmt(mean: float | None, std: float | None = None, pct: bool = True) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    scale = 100.0 if pct else 1.0
    if std is None or std == 0 or (isinstance(std, float) and math.isnan(std)):
        return f"{mean * scale:.1f}" if pct else f"{mean:.3f}"
    return f"{mean * scale:.1f} ± {std * scale:.1f}" if pct else f"{mean:.3f} ± {std:.3f}"


def group_cells(cells: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Cells by (setting, method), seeds together."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for c in cells:
        out.setdefault((c["setting"], c["method"]), []).append(c)
    return out


def success_stats(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and std over seeds of final success (overall and per family)."""
    ok = [c for c in cells if not c.get("error") and c.get("final", {}).get("mean") is not None]
    if not ok:
        return {"mean": None, "std": None, "per_family": {}, "seeds": 0}
    means = [c["final"]["mean"] for c in ok]
    fams: dict[str, list[float]] = {}
    for c in ok:
        for f, v in c["final"]["per_family"].items():
            fams.setdefault(f, []).append(v)
    return {
        "mean": float(np.mean(means)),
        "std": float(np.std(means)) if len(means) > 1 else None,
        "per_family": {
            f: (float(np.mean(v)), float(np.std(v)) if len(v) > 1 else None)
            for f, v in fams.items()
        },
        "seeds": len(ok),
    }


def pooled_successes(cells: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(successes, rollouts) of each cell's final evaluation, pooled over the cells' seeds.

    A cell's ``rollouts`` log holds every evaluation of the run; its last entry of ``evals``
    is the final one, with its success rate and rollout count."""
    k = n = 0
    for c in cells:
        evals = [] if c.get("error") else c.get("evals") or []
        if evals and evals[-1].get("rollouts"):
            final = evals[-1]
            k += round(final["mean"] * final["rollouts"])
            n += int(final["rollouts"])
    return k, n


def _pooled(cells: Sequence[dict[str, Any]]) -> str:
    k, n = pooled_successes(cells)
    if not n:
        return "-"
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f} ({k}/{n}) [{100 * lo:.1f}-{100 * hi:.1f}]"


def coassign_stats(cells: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """Fraction of (round, pair) where same-group pairs share a cluster / cross-group pairs do."""
    same, cross = [], []
    for c in cells:
        groups = c.get("groups") or []
        for row in c.get("rounds", []):
            m = row.get("coassign")
            if not m:
                continue
            for i in range(len(groups)):
                for j in range(i + 1, len(groups)):
                    (same if groups[i] == groups[j] else cross).append(m[i][j])
    return (float(np.mean(same)) if same else None, float(np.mean(cross)) if cross else None)


def method_table(
    setting: str, grouped: dict[tuple[str, str], list[dict[str, Any]]], methods: Sequence[str]
) -> str:
    """The papers' style table: success per family and mean (%, mean ± std over seeds), and
    the final rollouts pooled over seeds with their 95 % Wilson interval."""
    fams: list[str] = []
    for (s, _), cells in grouped.items():
        if s != setting:
            continue
        for c in cells:
            for f in c.get("final", {}).get("per_family", {}):
                if f not in fams:
                    fams.append(f)
    head = (
        "| method | "
        + " | ".join(fams)
        + " | mean | pooled (95 % Wilson) | same-group co-clustered | cross-group co-clustered"
        " | cluster CPU s/round | seeds | CPU s |"
    )
    lines = [head, "|" + "---|" * (len(fams) + 8)]
    for m in methods:
        cells = grouped.get((setting, m))
        if not cells:
            continue
        errs = [c["error"] for c in cells if c.get("error")]
        st = success_stats(cells)
        same, cross = coassign_stats([c for c in cells if not c.get("error")])
        fam_cells = [_fmt(*st["per_family"].get(f, (None, None))) for f in fams]
        cpu = np.mean([c.get("cpu_s", c.get("wall_s", 0.0)) for c in cells])
        ccost = [
            row["cluster_cpu_s"]
            for c in cells
            for row in c.get("rounds", [])
            if "cluster_cpu_s" in row
        ]
        ccost_s = f"{np.mean(ccost):.2f}" if ccost else "-"
        co = [f"{100 * v:.0f}%" if v is not None else "-" for v in (same, cross)]
        name = m + (f" (error: {errs[0][:60]})" if errs else "")
        lines.append(
            f"| {name} | "
            + " | ".join(fam_cells)
            + f" | {_fmt(st['mean'], st['std'])} | {_pooled(cells)} | {co[0]} | {co[1]} | {ccost_s}"
            f" | {st['seeds']} | {cpu:.0f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_success_vs_round(path: Path, setting: str, grouped: dict, methods: Sequence[str]) -> Path:
    """Closed-loop mean success vs round per method (mean over seeds)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in methods:
        cells = [c for c in grouped.get((setting, m), []) if not c.get("error")]
        if not cells:
            continue
        rounds = sorted({e["round"] for c in cells for e in c["evals"]})
        ys = [
            np.mean([e["mean"] for c in cells for e in c["evals"] if e["round"] == r])
            for r in rounds
        ]
        ax.plot([r + 1 for r in rounds], [100 * y for y in ys], marker="o", label=m)
    ax.set_xlabel("round")
    ax.set_ylabel("success rate (%)")
    ax.set_title(f"{setting}: closed-loop success vs round")
    ax.set_ylim(-5, 105)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_coassignment(path: Path, cell: dict[str, Any]) -> Path:
    """Heat map: fraction of rounds each robot pair shared a cluster, plus clusters per round."""
    plt = _plt()
    rows = [r for r in cell.get("rounds", []) if r.get("coassign")]
    m = np.mean([np.array(r["coassign"]) for r in rows], axis=0)
    clusters = np.array([r["clusters"] for r in rows]).T  # robots x rounds
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    im = a.imshow(m, vmin=0, vmax=1, cmap="viridis")
    labels = [f"{rid}\n{g}" for rid, g in zip(cell["robots"], cell["groups"])]
    a.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
    a.set_yticks(range(len(labels)), labels, fontsize=6)
    a.set_title(f"{cell['method']}: co-assignment (fraction of rounds)")
    fig.colorbar(im, ax=a)
    im2 = b.imshow(clusters, aspect="auto", cmap="tab10", interpolation="nearest")
    b.set_xlabel("round")
    b.set_xticks(range(clusters.shape[1]), [str(r["round"] + 1) for r in rows], fontsize=7)
    b.set_yticks(range(len(labels)), labels, fontsize=6)
    b.set_title("cluster id per robot over rounds")
    fig.colorbar(im2, ax=b)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_update_similarity(path: Path, cells: Sequence[dict[str, Any]]) -> Path:
    """FedDRMan Fig. 5: intra/inter-group cosine similarity of accumulated and per-round updates."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, kind, title in (
        (axes[0], "acc", "accumulated updates (theta_k - theta_0)"),
        (axes[1], "step", "per-round updates (theta_k^r - start)"),
    ):
        for c in cells:
            r = [row["round"] + 1 for row in c["rounds"]]
            ax.plot(
                r,
                [row.get(f"{kind}_intra") for row in c["rounds"]],
                "-o",
                label=f"{c['method']} intra",
            )
            ax.plot(
                r,
                [row.get(f"{kind}_inter") for row in c["rounds"]],
                "--x",
                label=f"{c['method']} inter",
            )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
    axes[0].set_ylabel("mean cosine similarity")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_matrix(
    path: Path, matrix: np.ndarray, labels: Sequence[str], title: str, cbar: str = ""
) -> Path:
    """Generic annotated heat map (RND novelty matrix s_ij)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    im = ax.imshow(matrix, cmap="magma_r")
    ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            ax.text(j, i, f"{matrix[i, j]:.2g}", ha="center", va="center", fontsize=5, color="cyan")
    ax.set_xlabel("predictor of robot j")
    ax.set_ylabel("data of robot i")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label=cbar)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_xy(
    path: Path,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
) -> Path:
    """Line plot of named (x, y) series (overlap sweep, loss vs alpha)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (x, y) in series.items():
        ax.plot(x, y, "-o", label=name)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

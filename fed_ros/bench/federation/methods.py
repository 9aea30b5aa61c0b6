"""The method table of `fed-ros bench federation`: which federated methods a cell can run.

A *method* is a strategy name from ``fed_ros.core.strategies.base.make_strategy`` plus strategy
settings and local-training switches (ablations included), or "centralized": one model trained on
the pooled data. The named methods, the FeDepth overlap-sweep names (fedepth_ovNNN) that are built
on demand, and the method lists the profiles run are one vocabulary, apart from the fleets
(`settings`) they run on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Method:
    """A federated method: strategy + its settings (ablations included: they reach the robots
    through the round config, exactly as a fleet file's `strategy:` settings would)."""

    name: str
    strategy: str  # make_strategy name, or "centralized"
    settings: tuple[tuple[str, Any], ...] = ()
    description: str = ""

    def strategy_settings(self, num_clusters: int) -> dict[str, Any]:
        """Strategy kwargs; the placeholder value "C" becomes the setting's cluster count."""
        return {k: (num_clusters if v == "C" else v) for k, v in self.settings}


# Only FedDRMan's round config turns on the distillation terms; the others train plain BC.
METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("local", "local", (), "each robot trains alone"),
        Method("centralized", "centralized", (), "one model on the pooled data"),
        Method("fedavg", "fedavg", (), "sample-weighted mean of all robots"),
        Method("fedprox", "fedprox", (("mu", 1e-3),), "FedAvg + proximal term mu=1e-3"),
        Method(
            "ifca", "ifca", (("num_clusters", "C"),), "robots pick the lowest-loss cluster model"
        ),
        Method("feddrman", "feddrman", (("num_clusters", "C"),), "CUA + SRB + L_sub + L_act"),
        Method(
            "feddrman_no_lsub", "feddrman", (("num_clusters", "C"), ("use_sub", False)), "ablation"
        ),
        Method(
            "feddrman_no_lact", "feddrman", (("num_clusters", "C"), ("use_act", False)), "ablation"
        ),
        Method(
            "feddrman_no_srb", "feddrman", (("num_clusters", "C"), ("use_srb", False)), "ablation"
        ),
        Method(
            "feddrman_no_cua", "feddrman", (("num_clusters", "C"), ("use_cua", False)), "ablation"
        ),
        Method("fedepth_soft", "fedepth", (("target_overlap", 0.2),), "soft clusters, 20% overlap"),
        Method(
            "fedepth_hard", "fedepth", (("target_overlap", 0.0), ("hard", True)), "hard clusters"
        ),
        Method("rnd", "rnd", (), "RND federations, FedAvg inside each"),
    )
}


def method_by_name(name: str) -> Method:
    """A METHODS entry, or a FeDepth sweep cell named fedepth_ovNNN (NNN = overlap in %)."""
    if name in METHODS:
        return METHODS[name]
    m = re.fullmatch(r"fedepth_ov(\d{3})", name)
    if m is None or int(m.group(1)) > 100:
        raise ValueError(
            f"unknown method {name!r}; known: {sorted(METHODS)} or fedepth_ovNNN "
            "with NNN in 000..100"
        )
    return fedepth_method(int(m.group(1)) / 100)


def fedepth_method(overlap: float) -> Method:
    """FeDepth at a given overlap ratio (the sensitivity sweep)."""
    settings: tuple[tuple[str, Any], ...] = (("target_overlap", float(overlap)),)
    if overlap == 0:
        settings += (("hard", True),)
    return Method(
        f"fedepth_ov{int(round(overlap * 100)):03d}", "fedepth", settings, f"overlap {overlap:.0%}"
    )


CORE_METHODS = (
    "local",
    "centralized",
    "fedavg",
    "fedprox",
    "ifca",
    "feddrman",
    "feddrman_no_cua",
    "fedepth_soft",
    "fedepth_hard",
    "rnd",
)
ALL_METHODS = tuple(METHODS)

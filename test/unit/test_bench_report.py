"""The federation benchmark's method table: the final rollouts pooled over seeds, with their
95 % Wilson interval, beside the mean and spread over seeds."""

from __future__ import annotations

from fed_ros.bench.federation.report import method_table, pooled_successes, wilson


def _cell(seed: int, rollouts: list[list], mean: float, error: str = "") -> dict:
    # The rollouts log holds an earlier evaluation too (all failures): only the final counts.
    earlier = [["lift", False, 200]] * len(rollouts)
    return {
        "setting": "few",
        "method": "feddrman",
        "seed": seed,
        "groups": [],
        "rounds": [],
        "rollouts": earlier + rollouts,
        "evals": [
            {"round": 0, "mean": 0.0, "rollouts": len(earlier)},
            {"round": 1, "mean": mean, "rollouts": len(rollouts)},
        ],
        "final": {"mean": mean, "per_family": {"lift": mean}},
        "cpu_s": 10.0,
        **({"error": error} if error else {}),
    }


def test_rollouts_pool_over_seeds_and_a_failed_cell_adds_none():
    cells = [
        _cell(0, [["lift", True, 90], ["lift", False, 200]], 0.5),
        _cell(1, [["lift", True, 80], ["lift", False, 200]], 0.5),
        _cell(2, [["lift", True, 80]] * 5, 1.0, error="ValueError: broken"),
    ]
    assert pooled_successes(cells) == (2, 4)


def test_method_table_prints_the_pooled_rate_with_its_wilson_interval():
    cells = [
        _cell(0, [["lift", True, 90], ["lift", False, 200]], 0.5),
        _cell(1, [["lift", True, 80], ["lift", False, 200]], 0.5),
    ]
    lo, hi = wilson(2, 4)
    assert (round(lo, 4), round(hi, 4)) == (0.15, 0.85)
    table = method_table("few", {("few", "feddrman"): cells}, ["feddrman"])
    head, rule, row = table.splitlines()
    assert "pooled (95 % Wilson)" in head and rule.count("|") == head.count("|")
    assert "| 50.0 (2/4) [15.0-85.0] |" in row

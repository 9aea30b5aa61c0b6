"""The int8_delta size model of docs/transport.md ("What the int8_delta ratio depends on"),
checked against the real encoder (fed_ros/bench/delta_ratio.py): payload ~ 4 B + N H / 8, so the
ratio to float32 falls with the entropy H of the levels and is not a constant of the encoding.
"""

from __future__ import annotations

import pytest

from fed_ros.bench.delta_ratio import drawn_delta, size_model, trained_delta


@pytest.fixture(scope="module")
def drawn() -> dict[str, dict]:
    return {d: size_model(drawn_delta(d)) for d in ("uniform", "gaussian", "laplace", "t3")}


def test_the_ratio_rises_as_the_levels_crowd_near_zero(drawn):
    ratios = [drawn[d]["ratio"] for d in ("uniform", "gaussian", "laplace", "t3")]
    assert ratios == sorted(ratios) and ratios[-1] - ratios[0] > 0.5, ratios
    # Flat deltas use every level alike: 8 bits, so the scales' 32 B / N bits are all deflate
    # leaves on top: 32 / (32 B / N + 8) = 3.88x for the fleet policy's tensors.
    uniform = drawn["uniform"]
    flat = 32 / (32 * uniform["blocks"] / uniform["values"] + 8)
    assert uniform["ratio"] == pytest.approx(flat, rel=0.01)


def test_the_model_predicts_zlib_within_three_percent_on_drawn_deltas(drawn):
    for name, m in drawn.items():
        assert m["ratio"] == pytest.approx(m["ratio_model_per_tensor"], rel=0.03), name
        assert m["ratio"] == pytest.approx(m["ratio_model_pooled"], rel=0.03), name


def test_a_trained_update_lies_between_the_pooled_and_per_tensor_models():
    m = size_model(trained_delta("bench", 10))
    assert m["ratio_model_pooled"] <= m["ratio"] <= m["ratio_model_per_tensor"], m
    assert m["payload_bytes"] < m["float32_bytes"] / 3.8

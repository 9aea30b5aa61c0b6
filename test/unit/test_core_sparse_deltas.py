"""Top-k sparse deltas with error feedback (fed_ros.core.encodings.topk), ROS-free: what is kept,
the bytes, the residual that carries the rest to later rounds, and hostile payloads."""

from __future__ import annotations

import numpy as np
import pytest

from fed_ros.core.encodings import feedback, topk as sd
from fed_ros.core.checks.decisions import SIZE_MISMATCH
from fed_ros.core.checks.payload_checks import check_payload_manifest
from fed_ros.core.params import TensorSpec


def _payload(tensors: dict[str, np.ndarray], fraction: float) -> np.ndarray:
    raw = b"".join(sd.encode_tensor(v, fraction, k) for k, v in tensors.items())
    return np.frombuffer(raw, np.uint8).copy()


def test_keeps_the_largest_entries_exactly_and_zeros_the_rest():
    x = np.zeros(300, np.float32)
    x[[1, 3, 6, 7]] = [-5.0, 3.0, 4.0, -0.01]
    out = sd.TopK(0.01).roundtrip({"w": x})["w"]  # k = ceil(300 * 0.01) = 3
    expected = np.zeros(300, np.float32)
    expected[[1, 3, 6]] = [-5.0, 3.0, 4.0]
    assert np.array_equal(out, expected)
    assert sd.topk_count(300, 0.01) == 3 and sd.topk_count(1000, 0.0001) == 1
    assert np.array_equal(sd.TopK(1.0).roundtrip({"w": x})["w"], x)


def test_small_tensors_travel_whole_without_indices():
    small = np.arange(sd.DENSE_MAX, dtype=np.float32)  # e.g. a normaliser's statistics
    assert sd.topk_count(sd.DENSE_MAX, 0.05) == sd.DENSE_MAX
    assert np.array_equal(sd.TopK(0.05).roundtrip({"s": small})["s"], small)
    assert len(sd.encode_tensor(small, 0.05)) == 4 + 4 * sd.DENSE_MAX  # values only
    assert sd.topk_count(sd.DENSE_MAX + 1, 0.05) == 13


def test_bytes_are_eight_per_kept_value_plus_a_count_per_tensor():
    tensors = {"a": np.ones((40, 25), np.float32), "b": np.ones(7, np.float32)}
    buf = _payload(tensors, 0.05)
    assert buf.size == sd.payload_nbytes([1000, 7], 0.05) == (4 + 8 * 50) + (4 + 4 * 7)
    lo, hi = sd.payload_bounds([1000, 7])
    assert lo <= buf.size <= hi and hi > 4 * 1007  # dense topk is larger than float32


def test_error_feedback_delivers_every_change_over_rounds(tmp_path):
    rng = np.random.default_rng(0)
    shape = (30, 20)
    fb = feedback.ErrorFeedback(tmp_path / "residual.npz")
    start = {"w": rng.normal(size=shape).astype(np.float32)}
    true_total = np.zeros(shape, np.float32)
    sent_total = np.zeros(shape, np.float32)
    for _ in range(6):
        trained = {"w": start["w"] + rng.normal(scale=0.1, size=shape).astype(np.float32)}
        true_total += trained["w"] - start["w"]
        full = fb.delta_to_send(trained, start)
        sent = sd.TopK(0.1).roundtrip(full)
        fb.keep_unsent(full, sent)
        sent_total += sent["w"]
        assert np.count_nonzero(sent["w"]) <= sd.topk_count(600, 0.1)
    # What was sent plus what waits on the robot is every change made (float rounding only).
    np.testing.assert_allclose(sent_total + fb.residual["w"], true_total, atol=1e-5)
    # Without the residual the same rounds would have lost most of the mass for good.
    assert fb.norm() < np.linalg.norm(true_total)
    again = feedback.ErrorFeedback(tmp_path / "residual.npz")  # a restarted robot keeps its memory
    assert np.array_equal(again.residual["w"], fb.residual["w"])


def test_residual_of_another_model_is_not_added_and_a_torn_file_is_ignored(tmp_path):
    path = tmp_path / "residual.npz"
    fb = feedback.ErrorFeedback(path)
    fb.keep_unsent({"w": np.ones(4, np.float32)}, {"w": np.zeros(4, np.float32)})
    other = {"v": np.ones(3, np.float32)}
    delta = feedback.ErrorFeedback(path).delta_to_send(other, {"v": np.zeros(3, np.float32)})
    assert delta["v"].tolist() == [1.0, 1.0, 1.0]  # the old residual (of "w") is not mixed in
    path.write_bytes(b"PK\x03\x04 torn")
    assert feedback.ErrorFeedback(path).residual == {}


def _bad(kind: str) -> bytes:
    good = sd.encode_tensor(np.arange(300, dtype=np.float32), 0.01, "w")  # k = 3 of 300
    count, idx, vals = good[:4], good[4:16], good[16:]
    if kind == "count_over_n":
        return np.uint32(301).tobytes() + idx + vals
    if kind == "unsorted":
        return count + np.array([299, 297, 298], "<u4").tobytes() + vals
    if kind == "repeated":
        return count + np.array([297, 297, 299], "<u4").tobytes() + vals
    if kind == "out_of_range":
        return count + np.array([297, 298, 300], "<u4").tobytes() + vals
    if kind == "nan":
        return count + idx + np.array([1, np.nan, 2], "<f4").tobytes()
    if kind == "trailing":
        return good + b"\x00" * 4
    if kind == "truncated":
        return good[:-4]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind,match",
    [
        ("count_over_n", "count 301 > its 300"),
        ("unsorted", "strictly increasing"),
        ("repeated", "strictly increasing"),
        ("out_of_range", "< 300"),
        ("nan", "not finite"),
        ("trailing", "after the last tensor"),
        ("truncated", "ends inside tensor"),
    ],
)
def test_hostile_payloads_are_refused_naming_the_tensor(kind, match):
    with pytest.raises(ValueError, match=match) as err:
        sd.decode_payload(np.frombuffer(_bad(kind), np.uint8), [300], ["w"])
    assert "'w'" in str(err.value) or kind == "trailing"


def test_encoding_refuses_non_finite_deltas_and_bad_fractions():
    with pytest.raises(ValueError, match="'w' is not finite"):
        sd.encode_tensor(np.array([1.0, np.inf], np.float32), 0.5, "w")
    for fraction in (0.0, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="fraction"):
            sd.check_fraction(fraction)


def test_apply_delta_needs_the_base_the_robot_started_from():
    base = {"w": np.array([1.0, 2.0], np.float32)}
    out, why = feedback.apply_delta(base, {"w": np.array([0.0, 0.5], np.float32)}, 0)
    assert why == "" and out["w"].tolist() == [1.0, 2.5]
    assert "cluster 3" in feedback.apply_delta(None, {"w": np.zeros(2, np.float32)}, 3)[1]
    assert "differ" in feedback.apply_delta(base, {"v": np.zeros(2, np.float32)}, 0)[1]
    assert "shape" in feedback.apply_delta(base, {"w": np.zeros(3, np.float32)}, 0)[1]


def test_the_server_size_check_takes_any_topk_size_the_manifest_allows():
    manifest = (TensorSpec("w", (10,), "float32"),)
    lo, hi = sd.payload_bounds([10])
    for total in (lo, sd.payload_nbytes([10], 0.3), hi):
        assert check_payload_manifest(manifest, total, sd.TopK.wire_id, manifest)
    for total in (lo - 1, hi + 1):
        d = check_payload_manifest(manifest, total, sd.TopK.wire_id, manifest)
        assert not d and d.code == SIZE_MISMATCH

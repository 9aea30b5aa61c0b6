"""`fed-ros bench aggregate` runs both paths over the same updates (a tiny cell, no timing)."""

from __future__ import annotations

from fed_ros.bench.aggregate import bench_case


def test_a_cell_reports_the_stacked_and_the_streamed_path(tmp_path):
    r = bench_case(6, 300_000, reps=1, spill_dir=str(tmp_path))
    assert set(r) >= {"stacked", "streamed", "split", "read", "svd"}
    # The stacked path holds the 6 updates on the heap; the streamed one reads them from the
    # spill file, so its heap peak is the cluster models and blocks only.
    assert r["stacked"]["peak"] > 6
    assert r["streamed"]["peak"] < r["stacked"]["peak"] - 3
    assert list(tmp_path.iterdir()) == []  # the spill's directory went with the cell
    # The server's round (Gram rows on arrival) is timed beside the close-time one.
    assert r["streamed"]["feddrman_arrivals"] > 0 and r["streamed"]["feddrman_close"] > 0


def test_a_streamed_only_cell_skips_the_stacked_path(tmp_path):
    r = bench_case(6, 300_000, reps=1, spill_dir=str(tmp_path), with_stacked=False)
    assert r["stacked"] is None
    assert r["streamed"]["peak"] < 6

"""`fed-ros bench async` (issue 26 item 3), a tiny smoke version of the benchmark: the real
coordinator, strategy, training and MuJoCo evaluation on a virtual clock, one robot 3x slower.

Checked: in the same virtual time the buffered fleet aggregates more often than the synchronous
one (which waits for the slow robot every round), uses stale updates, and both are evaluated at
the same instants; cells are cached and the report is written."""

from __future__ import annotations

import json

import pytest

from fed_ros.bench.federation import asynchronous as A
from fed_ros.bench.federation import asynchronous_report as AR


def test_time_to_target_and_wilson_interval():
    evals = [{"t": 3.0, "mean": 0.2}, {"t": 6.0, "mean": 0.6}, {"t": 9.0, "mean": 0.4}]
    assert AR.time_to_target(evals, 0.5) == 6.0 and AR.time_to_target(evals, 0.9) is None
    lo, hi = AR.wilson(64, 120)
    assert lo == pytest.approx(0.44, abs=0.01) and hi == pytest.approx(0.62, abs=0.01)


@pytest.mark.sim
def test_buffered_rounds_aggregate_more_often_in_the_same_virtual_time(tmp_path, capsys):
    out = tmp_path / "async"
    argv = ["--robots", "4", "--rounds", "2", "--local-steps", "2", "--demos", "2"]
    argv += ["--eval-episodes", "1", "--seeds", "0", "--methods", "fedavg", "--out", str(out)]
    assert A.main(argv) == 0
    cells = {
        c["mode"]: c for c in (json.loads(p.read_text()) for p in (out / "cells").glob("*.json"))
    }
    sync, buffered = cells["sync"], cells["async"]
    assert [e["t"] for e in sync["evals"]] == [e["t"] for e in buffered["evals"]] == [3.0, 6.0]
    assert len(sync["rounds"]) == 2  # each round waits for the slow robot (3 units)
    assert len(buffered["rounds"]) > 2 * len(sync["rounds"])
    # Round 0 is synchronous (buffer_sync_rounds 1); the later ones close on full buffers.
    assert "buffered/updates" not in buffered["rounds"][0]["buffered"]
    assert any(r["buffered"]["buffered/stale_updates"] > 0 for r in buffered["rounds"][1:])
    assert all(r["status"].startswith("completed (buffer full") for r in buffered["rounds"][1:])
    assert buffered["fits"]["robot_0"] > sync["fits"]["robot_0"]  # fast robots never wait
    assert not sync["rejected"]
    assert "| fedavg | async | 1 |" in (out / "report.md").read_text()
    # Cached: a second run trains nothing and prints the same report.
    first = capsys.readouterr().out
    assert A.main(argv) == 0
    assert capsys.readouterr().out.split("report:")[0] == first.split("report:")[0]

"""The server's spill file: accepted updates as rows of an unlinked memory-mapped file."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from fed_ros.core.params import flatten, manifest_of
from fed_ros.core.rounds.spill import RoundSpills, UpdateSpill
from fed_ros.core.strategies.base import make_strategy
from fed_ros.core.strategies.types import ClientUpdate

INIT = {"temporal.w": np.zeros((64, 32), np.float32), "head.w": np.zeros((32, 16), np.float32)}
MANIFEST = manifest_of(INIT)


def _sd(value: float) -> dict[str, np.ndarray]:
    return {k: np.full(v.shape, value, np.float32) for k, v in INIT.items()}


def test_added_update_reads_back_from_the_spill_and_leaves_no_file(tmp_path):
    spill = UpdateSpill(MANIFEST, 3, tmp_path)
    views = spill.add(_sd(2.5))
    assert list(tmp_path.iterdir()) == []  # unlinked once mapped: nothing to clean up
    assert np.array_equal(flatten(views), flatten(_sd(2.5)))
    assert len(spill) == 1
    assert not np.shares_memory(views["head.w"], _sd(2.5)["head.w"])


def test_full_spill_refuses_naming_its_capacity(tmp_path):
    spill = UpdateSpill(MANIFEST, 1, tmp_path)
    spill.add(_sd(1.0))
    with pytest.raises(ValueError, match=r"^UpdateSpill full \(capacity 1 updates\)$"):
        spill.add(_sd(2.0))


def test_malformed_update_is_refused_and_takes_no_row(tmp_path):
    spill = UpdateSpill(MANIFEST, 2, tmp_path)
    bad = _sd(1.0)
    bad["head.w"] = np.zeros((16, 32), np.float32)
    with pytest.raises(ValueError, match="head.w"):
        spill.add(bad)
    assert len(spill) == 0
    good = spill.add(_sd(3.0))
    assert np.array_equal(flatten(good), flatten(_sd(3.0)))


@pytest.mark.parametrize("capacity", [0, -1, 1.5])
def test_capacity_below_one_is_refused_naming_it(tmp_path, capacity):
    with pytest.raises(ValueError, match=f"got {capacity!r}"):
        UpdateSpill(MANIFEST, capacity, tmp_path)


def test_round_spills_keep_an_earlier_stage_rows_alive_and_fall_back_when_full(tmp_path):
    spills = RoundSpills(MANIFEST, tmp_path / "spill")
    assert spills.hold(_sd(1.0))["head.w"][0, 0] == 1.0  # no stage open: kept as given
    spills.open(1)
    first = spills.hold(_sd(4.0))
    spills.open(1)  # a re-announced stage: a fresh file; the first one's rows stay readable
    second = spills.hold(_sd(5.0))
    overflow = _sd(6.0)
    assert spills.hold(overflow) is overflow
    assert first["temporal.w"][3, 3] == 4.0 and second["temporal.w"][3, 3] == 5.0


def _traced_peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    out = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, peak


def test_strategy_aggregates_spilled_updates_without_holding_them_on_the_heap(tmp_path):
    """40 updates spilled in arrival order (not robot-id order, as at a server): FedDRMan's
    stacked path copies them all onto the heap, the streamed path keeps a few model sizes,
    and both give the same models."""
    init = {
        "temporal.w": np.zeros((512, 256), np.float32),
        "head.w": np.zeros((256, 512), np.float32),
    }
    K, rng = 40, np.random.default_rng(0)
    spill = UpdateSpill(manifest_of(init), K, tmp_path)
    updates = []
    for k in range(K):
        sd = {n: rng.standard_normal(v.shape).astype(np.float32) + k % 2 for n, v in init.items()}
        updates.append(ClientUpdate(f"r{K - 1 - k:02d}", spill.add(sd), 10, 0))
    ids = [u.robot_id for u in updates]
    model_bytes = 4 * sum(v.size for v in init.values())
    runs = {}
    for stack in (True, False):
        s = make_strategy("feddrman", num_clusters=2, stack_updates=stack)
        s.initialize(init, ids)
        runs[stack] = _traced_peak(lambda: s.aggregate_round(0, updates, {}))
    for c, m in runs[True][0].cluster_models.items():
        assert np.array_equal(flatten(runs[False][0].cluster_models[c]), flatten(m))
    assert runs[True][1] / model_bytes > K
    assert runs[False][1] / model_bytes < 8


def test_round_spills_keep_a_malformed_update_as_given_and_take_no_row(tmp_path):
    spills = RoundSpills(MANIFEST, tmp_path)
    spills.open(1)
    bad = _sd(1.0)
    bad["head.w"] = np.zeros((16, 32), np.float32)
    assert spills.hold(bad) is bad
    assert len(spills.current) == 0


# --- release: the rows' pages leave the RSS, their data stays ---------------------------------

BIG_P = 1 << 20  # 4 MB rows


def _rss_file_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile in /proc/self/status")


def _row(i: int) -> dict[str, np.ndarray]:
    return {"w": np.arange(BIG_P, dtype=np.float32) * np.float32(i + 1)}


def test_release_unmaps_the_rows_and_keeps_their_data(tmp_path):
    spill = UpdateSpill(manifest_of({"w": np.zeros(BIG_P, np.float32)}), 64, tmp_path)
    views = [spill.add(_row(i)) for i in range(64)]  # 256 MB written: mapped
    before = _rss_file_mb()
    assert spill.release()
    after = _rss_file_mb()
    assert before - after > 200, f"RssFile {before:.0f} -> {after:.0f} MB: nothing unmapped"
    for i, v in enumerate(views):  # the same bytes, from the page cache
        assert np.array_equal(v["w"], _row(i)["w"]), f"row {i} lost by release"
    assert _rss_file_mb() - after > 200  # reading mapped them again
    assert len(spill) == 64


def test_release_beside_writes_and_reads_loses_nothing(tmp_path):
    import threading

    spill = UpdateSpill(manifest_of({"w": np.zeros(BIG_P, np.float32)}), 40, tmp_path)
    stop = threading.Event()
    released = []

    def release_loop():
        while not stop.is_set():
            released.append(spill.release())

    worker = threading.Thread(target=release_loop)
    worker.start()
    try:
        views = []
        for i in range(40):
            views.append(spill.add(_row(i)))
            j = i // 2  # read an earlier row while the pages come and go
            assert np.array_equal(views[j]["w"], _row(j)["w"])
    finally:
        stop.set()
        worker.join()
    assert len(released) > 1 and all(released)
    for i, v in enumerate(views):
        assert np.array_equal(v["w"], _row(i)["w"]), f"row {i} lost beside release"


def test_round_spills_release_the_open_stage_only(tmp_path):
    spills = RoundSpills(manifest_of({"w": np.zeros(BIG_P, np.float32)}), tmp_path)
    spills.release()  # none open: nothing to do
    spills.open(8)
    views = [spills.hold(_row(i)) for i in range(8)]
    before = _rss_file_mb()
    spills.release()
    assert before - _rss_file_mb() > 24
    assert all(np.array_equal(v["w"], _row(i)["w"]) for i, v in enumerate(views))

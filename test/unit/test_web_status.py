"""`fed-ros status --web` without ROS: the snapshot the page draws, the HTTP server and the
camera frames it serves."""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.request

import pytest

from fed_ros.ros.operator.round_history import RoundHistory
from fed_ros.ros.operator.web_status import StatusWebServer, fleet_snapshot

ANNOUNCEMENT = {
    "round": 2,
    "stage": "train",
    "algorithm": "feddrman",
    "participants": ["robot_0", "robot_1"],
    "quorum": 2,
    "deadline": 1000.0,
    "memberships": {"robot_0": [(0, 1.0)], "robot_1": [(1, 1.0)]},
}


def _report(round_idx: int, success: float) -> dict:
    line = dict(cluster_ids=[0], train_loss=0.5, interventions_per_episode=math.nan, reason="")
    return {
        "round": round_idx,
        "status": "completed",
        "completed": True,
        "updates_received": 3,
        "updates_accepted": 2,
        "updates_rejected": 1,
        "robots": [
            {**line, "robot_id": "robot_0", "accepted": True, "success_rate": success},
            {**line, "robot_id": "robot_1", "accepted": True, "success_rate": math.nan},
            {
                **line,
                "robot_id": "robot_2",
                "accepted": False,
                "reason": "straggler: no update by the deadline",
                "success_rate": math.nan,
            },
        ],
    }


def test_snapshot_has_each_robots_state_clusters_success_and_the_timeline():
    snap = fleet_snapshot(ANNOUNCEMENT, [_report(0, 0.25), _report(1, math.nan)], now=990.0)
    assert (snap["round"], snap["stage"], snap["deadline_in_s"]) == (2, "train", 10.0)
    robots = {r["robot_id"]: r for r in snap["robots"]}
    assert robots["robot_0"]["state"] == "train round 2" and robots["robot_0"]["clusters"] == [0]
    # The newest measured success stays on the page when a later round did not evaluate.
    assert robots["robot_0"]["success"] == 0.25 and robots["robot_1"]["success"] is None
    assert robots["robot_2"]["state"] == "sat the round out"
    assert not robots["robot_2"]["accepted"] and "straggler" in robots["robot_2"]["reason"]
    assert snap["clusters"] == [
        {"cluster_id": 0, "members": ["robot_0", "robot_2"]},
        {"cluster_id": 1, "members": ["robot_1"]},
    ]
    assert [t["round"] for t in snap["timeline"]] == [0, 1]
    json.dumps(snap, allow_nan=False)  # NaN became null: valid JSON for the browser


def test_a_finished_fleet_has_no_deadline():
    snap = fleet_snapshot({**ANNOUNCEMENT, "stage": "done"}, [], now=990.0)
    assert snap["deadline_in_s"] is None and snap["robots"][0]["state"] == "done"


def test_snapshot_before_the_server_answers():
    snap = fleet_snapshot(None, [], now=0.0)
    assert snap["stage"] == "waiting" and snap["robots"] == [] and snap["deadline_in_s"] is None


def test_server_serves_the_page_and_the_snapshot_and_nothing_else():
    web = StatusWebServer(lambda: {"round": 7}, port=0).start()
    try:
        page = urllib.request.urlopen(web.url, timeout=10).read().decode()
        assert "<title>fed_ros fleet</title>" in page and "status.json" in page
        data = json.loads(urllib.request.urlopen(web.url + "status.json", timeout=10).read())
        assert data == {"round": 7}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(web.url + "../etc/passwd", timeout=10)
        assert err.value.code == 404
    finally:
        web.close()


def test_camera_thumbnails_are_small_pngs_any_decoder_reads():
    import io

    import numpy as np
    from PIL import Image

    from fed_ros.ros.operator.camera_thumbnails import THUMB_SIDE, data_url, png_bytes, thumbnail

    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (84, 84, 3), dtype=np.uint8)
    with Image.open(io.BytesIO(png_bytes(frame))) as img:
        assert img.mode == "RGB" and np.array_equal(np.asarray(img), frame)
    big = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    small = thumbnail(big)
    assert max(small.shape[:2]) <= THUMB_SIDE and np.array_equal(small, big[::7, ::7])
    assert data_url(big).startswith("data:image/png;base64,")
    with pytest.raises(ValueError, match="HxWx3"):
        png_bytes(np.zeros((4, 4), np.uint8))
    snap = fleet_snapshot(ANNOUNCEMENT, [], 0.0, {"robot_0": "data:image/png;base64,AAAA"})
    cams = {r["robot_id"]: r["thumbnail"] for r in snap["robots"]}
    assert cams["robot_0"] == "data:image/png;base64,AAAA" and cams["robot_1"] is None


def test_snapshot_carries_the_round_history_for_the_charts():
    history = RoundHistory()
    for r, success in enumerate((0.25, math.nan)):
        history.add(_report(r, success))
    snap = fleet_snapshot(ANNOUNCEMENT, [], 0.0, history=history.series())
    assert snap["history"]["rounds"] == [0, 1]
    robots = {s["id"]: s for s in snap["history"]["robots"]}
    assert robots["robot_0"]["success"] == [0.25, None]
    assert robots["robot_2"]["train_loss"] == [0.5, 0.5]
    assert fleet_snapshot(None, [], 0.0)["history"]["rounds"] == []
    json.dumps(snap, allow_nan=False)


def test_server_serves_a_robots_large_camera_frame_and_nothing_for_other_names():
    from fed_ros.ros.operator.camera_thumbnails import png_bytes

    import numpy as np

    png = png_bytes(np.full((240, 320, 3), 200, np.uint8))
    asked: list[str] = []

    def frame(robot_id: str) -> bytes | None:
        asked.append(robot_id)
        return png if robot_id == "robot_0" else None

    web = StatusWebServer(lambda: {}, port=0, camera_frame=frame).start()
    try:
        answer = urllib.request.urlopen(web.url + "camera/robot_0.png?t=1", timeout=10)
        assert answer.headers["Content-Type"] == "image/png" and answer.read() == png
        for path, why in (
            ("camera/robot_1.png", "no camera frame from 'robot_1'"),
            ("camera/..%2Frobot_0.png", "not a robot id"),
            ("camera/r%C3%A9.png", "not a robot id"),  # not ASCII: still a clean 404
            ("camera/robot_0.jpg", "only /, /status.json and /camera/"),
        ):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(web.url + path, timeout=10)
            assert err.value.code == 404 and why in err.value.read().decode(), path
        assert asked == ["robot_0", "robot_1"]  # a malformed name never reaches the cameras
    finally:
        web.close()
    web = StatusWebServer(lambda: {}, port=0).start()  # no cameras watched
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(web.url + "camera/robot_0.png", timeout=10)
        assert err.value.code == 404
    finally:
        web.close()


def test_large_camera_frames_are_bounded_and_larger_than_thumbnails():
    import numpy as np

    from fed_ros.ros.operator.camera_thumbnails import LARGE_SIDE, THUMB_SIDE, thumbnail

    big = np.zeros((480, 640, 3), np.uint8)
    large = thumbnail(big, LARGE_SIDE)
    assert max(large.shape[:2]) <= LARGE_SIDE and large.shape[:2] == (240, 320)
    assert max(large.shape[:2]) > 2 * max(thumbnail(big).shape[:2])
    assert thumbnail(np.zeros((84, 84, 3), np.uint8), LARGE_SIDE).shape == (84, 84, 3)
    assert THUMB_SIDE < LARGE_SIDE <= 640
    with pytest.raises(ValueError, match="side must be a positive"):
        thumbnail(big, 0)


def test_the_page_fetches_nothing_from_elsewhere():
    """No script, style sheet, font or image from another address: only relative paths."""
    from fed_ros.ros.operator.web_page import PAGE

    assert re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}", PAGE) == []
    assert not re.search(r"<(?:link|iframe)\b|<script\s[^>]*src=|@import|url\(", PAGE)
    assert re.findall(r"fetch\(([^,)]+)", PAGE) == ['"status.json"']
    assert '"camera/" + encodeURIComponent(cameraRobot)' in PAGE  # the larger view, relative

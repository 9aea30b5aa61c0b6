"""The live view's cameras over real DDS: a robot's frames (sensor_msgs/Image on its arm's
camera topic, published as a camera driver does) become a thumbnail and, on request, a larger
frame; both bounded in size and re-encoded at most once per period."""

from __future__ import annotations

import base64
import io
import time

import numpy as np
import pytest

from conftest import wait_until

rclpy = pytest.importorskip("rclpy")


def _decoded(png: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        return np.asarray(img.convert("RGB"))


@pytest.mark.timeout(120)
def test_large_frames_are_bounded_in_size_and_rate(ros_env):
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image

    from fed_ros.ros.operator.camera_thumbnails import LARGE_SIDE, THUMB_SIDE, CameraThumbnails
    from fed_ros.ros.wire import qos
    from fed_ros.ros.wire.images import image_to_msg

    context = rclpy.Context()
    rclpy.init(context=context)
    camera_node = rclpy.create_node("test_camera", context=context)
    view_node = rclpy.create_node("test_view", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(camera_node)
    executor.add_node(view_node)
    try:
        pub = camera_node.create_publisher(
            Image, "/robot_0/arm/agentview/image_raw", qos.sensor_qos(1)
        )
        cameras = CameraThumbnails(view_node, min_period_s=3.0)
        cameras.watch(["robot_0"])
        red = np.zeros((480, 640, 3), np.uint8)
        red[..., 0] = 220
        blue = np.zeros((480, 640, 3), np.uint8)
        blue[..., 2] = 220

        asked_at: list[float] = []  # before each request: the encoding happened after it

        def shown(frame: np.ndarray) -> bool:
            pub.publish(image_to_msg(frame, "rgb8"))
            executor.spin_once(timeout_sec=0.1)
            asked_at.append(time.monotonic())
            png = cameras.large_png("robot_0")
            return png is not None and _decoded(png)[0, 0].tolist() == frame[0, 0].tolist()

        wait_until(lambda: shown(red), 30, "robot_0's first large frame")
        encoded_after = asked_at[-1]
        large = _decoded(cameras.large_png("robot_0"))
        assert large.shape == (240, 320, 3) and max(large.shape[:2]) <= LARGE_SIDE
        assert cameras.data_urls()["robot_0"].startswith("data:image/png;base64,")
        # A new frame within the period: the cached one is served, nothing is re-encoded.
        for _ in range(5):
            pub.publish(image_to_msg(blue, "rgb8"))
            executor.spin_once(timeout_sec=0.1)
        checked_at = time.monotonic()
        served = _decoded(cameras.large_png("robot_0"))
        assert checked_at - encoded_after < 3.0, "the machine was too slow for this check"
        assert served[0, 0].tolist() == red[0, 0].tolist()
        wait_until(lambda: shown(blue), 30, "the newer frame once the period passed")
        assert time.monotonic() - encoded_after >= 3.0
        assert cameras.large_png("robot_1") is None  # not watched: no frame
        url = cameras.data_urls()["robot_0"]
        thumb = _decoded(base64.b64decode(url.split(",", 1)[1]))
        assert max(thumb.shape[:2]) <= THUMB_SIDE
    finally:
        executor.shutdown()
        camera_node.destroy_node()
        view_node.destroy_node()
        rclpy.try_shutdown(context=context)


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_the_encoding_period_must_be_a_number_of_seconds(bad):
    from fed_ros.ros.operator.camera_thumbnails import CameraThumbnails

    with pytest.raises(ValueError, match=f"min_period_s must be >= 0 s, got {bad}"):
        CameraThumbnails(None, min_period_s=bad)

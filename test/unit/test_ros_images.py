"""sensor_msgs/Image <-> numpy (pure, no ROS processes)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Image

from fed_ros.ros.wire.images import ENCODINGS, image_to_msg, msg_to_image


def _image(encoding: str, h: int = 5, w: int = 7, seed: int = 0) -> np.ndarray:
    dtype, channels = ENCODINGS[encoding]
    rng = np.random.default_rng(seed)
    shape = (h, w) if channels == 1 else (h, w, channels)
    if dtype == np.float32:
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(0, np.iinfo(dtype).max, size=shape, endpoint=True).astype(dtype)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "mono8", "16UC1", "32FC1", "mono16"])
def test_round_trip_through_serialization(encoding: str) -> None:
    img = _image(encoding)
    msg = image_to_msg(img, encoding, frame_id="agentview")
    dtype, channels = ENCODINGS[encoding]
    assert (msg.height, msg.width, msg.step) == (5, 7, 7 * channels * dtype.itemsize)
    assert msg.is_bigendian == (sys.byteorder == "big")
    back_msg = deserialize_message(serialize_message(msg), Image)
    out = msg_to_image(back_msg, backend="own")
    assert out.dtype == dtype and out.shape == img.shape
    np.testing.assert_array_equal(out, img)
    np.testing.assert_array_equal(msg_to_image(back_msg, backend="auto"), img)


def test_building_is_zero_copy_for_contiguous_input() -> None:
    img = _image("rgb8", 84, 84)
    msg = image_to_msg(img)
    assert np.shares_memory(np.asarray(msg._data), img)


def test_reading_is_zero_copy_unless_asked() -> None:
    msg = deserialize_message(serialize_message(image_to_msg(_image("16UC1"), "16UC1")), Image)
    view = msg_to_image(msg, backend="own")
    assert np.shares_memory(view, np.frombuffer(msg.data, np.uint8))
    assert not np.shares_memory(
        msg_to_image(msg, copy=True, backend="own"), np.frombuffer(msg.data, np.uint8)
    )


@pytest.mark.parametrize("encoding", ["rgb8", "16UC1", "32FC1"])
def test_padded_rows_are_skipped(encoding: str) -> None:
    img = _image(encoding, 4, 3, seed=3)
    dtype, channels = ENCODINGS[encoding]
    row = 3 * channels * dtype.itemsize
    step = row + 5  # odd padding, as some drivers produce
    raw = np.zeros((4, step), np.uint8)
    raw[:, :row] = img.reshape(4, -1).view(np.uint8).reshape(4, row)
    msg = Image(
        height=4, width=3, encoding=encoding, step=step, is_bigendian=int(sys.byteorder == "big")
    )
    msg.data = raw.tobytes()
    np.testing.assert_array_equal(msg_to_image(msg, backend="own"), img)


def test_big_endian_16uc1_is_swapped() -> None:
    img = np.array([[1, 256], [65535, 4660]], np.uint16)
    msg = Image(height=2, width=2, encoding="16UC1", step=4, is_bigendian=1)
    msg.data = img.astype(">u2").tobytes()
    out = msg_to_image(msg, backend="own")
    assert out.dtype == np.uint16 and out.dtype.byteorder in ("=", "|")
    np.testing.assert_array_equal(out, img)


def test_big_endian_32fc1_is_swapped() -> None:
    img = np.array([[1.5, -2.25]], np.float32)
    msg = Image(height=1, width=2, encoding="32FC1", step=8, is_bigendian=1)
    msg.data = img.astype(">f4").tobytes()
    np.testing.assert_array_equal(msg_to_image(msg, backend="own"), img)


def test_colour_conversions() -> None:
    rgb = _image("rgb8")
    msg = image_to_msg(rgb, "rgb8")
    np.testing.assert_array_equal(msg_to_image(msg, "bgr8"), rgb[:, :, ::-1])
    rgba = msg_to_image(msg, "rgba8")
    np.testing.assert_array_equal(rgba[:, :, :3], rgb)
    assert np.all(rgba[:, :, 3] == 255)
    bgr_msg = image_to_msg(np.ascontiguousarray(rgb[:, :, ::-1]), "bgr8")
    np.testing.assert_array_equal(msg_to_image(bgr_msg, "rgb8"), rgb)
    mono = _image("mono8")
    np.testing.assert_array_equal(
        msg_to_image(image_to_msg(mono, "mono8"), "rgb8"), np.stack([mono] * 3, axis=2)
    )
    with pytest.raises(ValueError, match="'32FC1' to 'rgb8'"):
        msg_to_image(image_to_msg(_image("32FC1"), "32FC1"), "rgb8")


def test_bad_inputs_raise_naming_the_value() -> None:
    with pytest.raises(ValueError, match="'yuv422'"):
        image_to_msg(_image("rgb8"), "yuv422")
    with pytest.raises(ValueError, match="dtype uint8"):
        image_to_msg(_image("rgb8").astype(np.float32), "rgb8")
    with pytest.raises(ValueError, match=r"\(5, 7, 4\)"):
        image_to_msg(_image("rgba8"), "rgb8")
    short = Image(height=4, width=4, encoding="rgb8", step=12)
    short.data = bytes(40)
    with pytest.raises(ValueError, match="40 bytes"):
        msg_to_image(short)
    narrow = Image(height=1, width=4, encoding="rgb8", step=8)
    narrow.data = bytes(8)
    with pytest.raises(ValueError, match="step 8"):
        msg_to_image(narrow)

"""sensor_msgs/Image <-> numpy, zero-copy where the layout allows.

Supported encodings: rgb8, bgr8, rgba8, bgra8, mono8, mono16, 8UC1, 8UC3, 16UC1, 32FC1.
``step`` (row stride, may include padding) and ``is_bigendian`` are honoured on reading;
writing always produces tightly packed rows in the machine's byte order.

cv_bridge is used when it is importable AND passes a self-check (a 16UC1 round trip keeps
uint16): the PyPI ``cv-bridge`` package is the old ROS 1 code and decodes 16UC1 as uint8
(see /work/shared/ros2-pip.md), so an import alone is not trusted. Our own conversion is
the fallback and the default here; both give identical arrays.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

import numpy as np
from sensor_msgs.msg import Image

from fed_ros.ros.wire.tensors import set_bytes_field

# encoding -> (numpy dtype, channels)
ENCODINGS: dict[str, tuple[np.dtype, int]] = {
    "rgb8": (np.dtype(np.uint8), 3),
    "bgr8": (np.dtype(np.uint8), 3),
    "rgba8": (np.dtype(np.uint8), 4),
    "bgra8": (np.dtype(np.uint8), 4),
    "mono8": (np.dtype(np.uint8), 1),
    "8UC1": (np.dtype(np.uint8), 1),
    "8UC3": (np.dtype(np.uint8), 3),
    "mono16": (np.dtype(np.uint16), 1),
    "16UC1": (np.dtype(np.uint16), 1),
    "32FC1": (np.dtype(np.float32), 1),
}
# Colour-order conversions offered by msg_to_image(desired_encoding=...).
_COLOUR = {"rgb8": (0, 1, 2), "bgr8": (2, 1, 0), "rgba8": (0, 1, 2, 3), "bgra8": (2, 1, 0, 3)}
_NATIVE_BIG = sys.byteorder == "big"


def image_to_msg(
    image: np.ndarray, encoding: str = "rgb8", frame_id: str = "", stamp: Any = None
) -> Image:
    """numpy (H,W) or (H,W,C) -> sensor_msgs/Image; one copy at most (none if contiguous)."""
    if encoding not in ENCODINGS:
        raise ValueError(
            f"unsupported image encoding {encoding!r}; expected one of {sorted(ENCODINGS)}"
        )
    dtype, channels = ENCODINGS[encoding]
    arr = np.asarray(image)
    if arr.dtype != dtype:
        raise ValueError(f"encoding {encoding!r} needs dtype {dtype}, got {arr.dtype}")
    if arr.ndim == 3 and channels == 1 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    expected_ndim = 2 if channels == 1 else 3
    if arr.ndim != expected_ndim or (channels > 1 and arr.shape[2] != channels):
        raise ValueError(
            f"encoding {encoding!r} needs shape (H, W{'' if channels == 1 else f', {channels}'}), "
            f"got {arr.shape}"
        )
    height, width = int(arr.shape[0]), int(arr.shape[1])
    arr = np.ascontiguousarray(arr)  # no copy when already contiguous (e.g. rendered frames)
    msg = Image(
        height=height,
        width=width,
        encoding=encoding,
        is_bigendian=int(_NATIVE_BIG),
        step=width * channels * dtype.itemsize,
    )
    msg.header.frame_id = frame_id
    if stamp is not None:
        msg.header.stamp = stamp
    set_bytes_field(msg, "data", arr.reshape(-1).view(np.uint8))
    return msg


def _own_decode(msg: Image, copy: bool) -> np.ndarray:
    dtype, channels = ENCODINGS[msg.encoding]
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    row_bytes = width * channels * dtype.itemsize
    if step < row_bytes:
        raise ValueError(
            f"image step {step} < width*channels*itemsize = {row_bytes} ({msg.encoding}, {width} "
            "px)"
        )
    if len(msg.data) < step * height:
        raise ValueError(f"image data has {len(msg.data)} bytes, step*height = {step * height}")
    if height == 0 or width == 0:
        shape = (height, width) if channels == 1 else (height, width, channels)
        return np.zeros(shape, dtype=dtype)
    raw = np.frombuffer(msg.data, dtype=np.uint8, count=step * height)
    big = bool(msg.is_bigendian)
    wire = dtype.newbyteorder(">" if big else "<") if dtype.itemsize > 1 else dtype
    # Strided view: rows start every `step` bytes, padding skipped, no copy.
    shape = (height, width) if channels == 1 else (height, width, channels)
    strides = (
        (step, channels * dtype.itemsize)
        if channels == 1
        else (step, channels * dtype.itemsize, dtype.itemsize)
    )
    view = (
        np.lib.stride_tricks.as_strided(
            raw.view(np.uint8), shape=shape, strides=strides, writeable=False
        )
        if dtype.itemsize == 1
        else None
    )
    if view is None:
        rows = raw.reshape(height, step)[:, :row_bytes]
        view = rows.view(wire).reshape(shape)
    if view.dtype.byteorder not in ("=", "|") and view.dtype != dtype:
        return view.astype(dtype)  # byte swap needed: that is the copy
    return np.array(view, copy=True) if copy else view


@lru_cache(maxsize=1)
def _cv_bridge() -> Any | None:
    """A CvBridge instance if cv_bridge imports and decodes 16UC1 correctly, else None."""
    try:
        from cv_bridge import CvBridge  # type: ignore[import-not-found]

        bridge = CvBridge()
        probe = image_to_msg(np.array([[1, 65535]], dtype=np.uint16), "16UC1")
        back = bridge.imgmsg_to_cv2(probe)
        if back.dtype != np.uint16 or back.tolist() != [[1, 65535]]:
            return None
        return bridge
    except Exception:  # noqa: BLE001 - any failure means "do not trust it"
        return None


def msg_to_image(
    msg: Image, desired_encoding: str | None = None, copy: bool = False, backend: str = "auto"
) -> np.ndarray:
    """sensor_msgs/Image -> numpy; honours step/is_bigendian; zero copy when possible.

    ``desired_encoding`` converts between rgb8/bgr8/rgba8/bgra8 (and mono8 -> rgb8/bgr8);
    ``backend``: "auto" (cv_bridge if trustworthy, else own), "own", "cv_bridge".
    """
    if msg.encoding not in ENCODINGS:
        raise ValueError(
            f"unsupported image encoding {msg.encoding!r}; expected one of {sorted(ENCODINGS)}"
        )
    if backend not in ("auto", "own", "cv_bridge"):
        raise ValueError(f"unknown image backend {backend!r}")
    bridge = _cv_bridge() if backend != "own" else None
    if backend == "cv_bridge" and bridge is None:
        raise ValueError("backend 'cv_bridge' requested but no working cv_bridge is importable")
    image = np.asarray(bridge.imgmsg_to_cv2(msg)) if bridge is not None else _own_decode(msg, copy)
    if desired_encoding is None or desired_encoding == msg.encoding:
        return image
    return convert_encoding(image, msg.encoding, desired_encoding)


def convert_encoding(image: np.ndarray, source: str, target: str) -> np.ndarray:
    """Reorder colour channels between rgb8/bgr8/rgba8/bgra8, or expand mono8 to colour."""
    if source == target:
        return image
    if source in ("mono8", "8UC1") and target in ("rgb8", "bgr8"):
        return np.repeat(image[:, :, None], 3, axis=2)
    if source in _COLOUR and target in _COLOUR:
        src = _COLOUR[source]
        # index of each target channel within the source layout (RGB -> 0,1,2; alpha -> 3)
        order = [src.index(c) for c in _COLOUR[target] if c in src]
        if len(order) != len(_COLOUR[target]):
            # rgb -> rgba: add an opaque alpha channel
            alpha = np.full(image.shape[:2] + (1,), 255, dtype=image.dtype)
            return np.concatenate(
                [image[:, :, [src.index(c) for c in _COLOUR[target][:3]]], alpha], axis=2
            )
        return np.ascontiguousarray(image[:, :, order])
    raise ValueError(f"cannot convert image encoding {source!r} to {target!r}")


def decode_camera(msg: Any, compressed: bool, size: int = 0) -> np.ndarray:
    """Image (rgb8/bgr8/rgba8/bgra8/mono8) or CompressedImage (JPEG/PNG) -> HxWx3 uint8 RGB,
    resized to ``size`` x ``size`` (0: as it came); owns its memory."""
    import cv2

    if compressed:
        bgr = cv2.imdecode(np.frombuffer(bytes(msg.data), np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(
                f"cannot decode compressed image (format {msg.format!r}, {len(msg.data)} bytes)"
            )
        image = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    else:
        if msg.encoding not in ("rgb8", "bgr8", "rgba8", "bgra8", "mono8"):
            raise ValueError(f"unsupported camera image encoding {msg.encoding!r} (expected rgb8)")
        image = msg_to_image(msg, desired_encoding="rgb8", backend="own")[..., :3]
    if size and image.shape[:2] != (size, size):
        # INTER_AREA: the least aliasing when shrinking a camera frame to the policy's input.
        image = cv2.resize(np.ascontiguousarray(image), (size, size), interpolation=cv2.INTER_AREA)
    return np.array(image, dtype=np.uint8, copy=True)


def encode_compressed(image: np.ndarray, fmt: str = "jpeg") -> bytes:
    """HxWx3 uint8 RGB -> JPEG or PNG bytes (what a camera driver's image_transport sends)."""
    import cv2

    ext = {"jpeg": ".jpg", "png": ".png"}.get(fmt)
    if ext is None:
        raise ValueError(f"compressed format {fmt!r} is not 'jpeg' or 'png'")
    ok, data = cv2.imencode(ext, np.ascontiguousarray(np.asarray(image)[..., ::-1]))
    if not ok:
        raise ValueError(f"cannot encode a {np.asarray(image).shape} image as {fmt}")
    return data.tobytes()

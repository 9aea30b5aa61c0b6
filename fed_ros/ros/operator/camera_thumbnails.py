"""Cameras of `fed-ros status --web`: each robot's newest frame as a small PNG, and larger.

The status page is one self-contained file served by the standard library, so the thumbnails
travel inside its JSON as ``data:image/png`` URLs. A frame is subscribed best effort, depth 1
(the newest only; a monitor never slows a camera down), shrunk by striding to at most
:data:`THUMB_SIDE` pixels and encoded with :func:`png_bytes` (zlib, no image library): at most
once a second per robot, and only when a new frame came. The page's larger view (a click on a
thumbnail) asks for ``/camera/<robot>.png``: the same newest frame, at most :data:`LARGE_SIDE`
pixels a side, encoded only when asked for and at most once a period per robot, however many
pages ask (in between they get the cached PNG).

The topic is ``/<robot>/arm/<camera>/image_raw`` by default, the fleet's convention for sim
bridges and arm adapters alike (docs/fleet.md); ``--camera-topic`` takes another template for arms
whose cameras live elsewhere.
"""

from __future__ import annotations

import base64
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

THUMB_SIDE = 96
# The larger view: 640x480 cameras show at 320x240 (stride 2), the sim's 84x84 and 256x256 ones
# whole. A 480x480 frame is 0.7 MB raw, a PNG of a few hundred kB at most once a second.
LARGE_SIDE = 480
DEFAULT_TOPIC = "/{robot}/arm/{camera}/image_raw"


def png_bytes(rgb: np.ndarray) -> bytes:
    """An HxWx3 uint8 RGB image as PNG bytes (8-bit truecolour, no filter, zlib level 6)."""
    image = np.ascontiguousarray(rgb, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3 or not image.size:
        raise ValueError(f"png_bytes needs an HxWx3 image, got shape {image.shape}")
    h, w, _ = image.shape
    rows = np.concatenate([np.zeros((h, 1), np.uint8), image.reshape(h, w * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


def thumbnail(rgb: np.ndarray, side: int = THUMB_SIDE) -> np.ndarray:
    """The image shrunk by an integer stride so that neither side exceeds ``side``."""
    if side < 1:
        raise ValueError(f"side must be a positive number of pixels, got {side!r}")
    h, w = rgb.shape[:2]
    stride = max(1, -(-max(h, w) // side))
    return np.ascontiguousarray(rgb[::stride, ::stride, :3])


def data_url(rgb: np.ndarray) -> str:
    """A thumbnail's PNG as a data URL for an <img> element."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(thumbnail(rgb))).decode("ascii")


class CameraThumbnails:
    """Subscribes to each watched robot's camera; keeps its newest frame as a thumbnail data URL
    and, when asked, as a larger PNG (each re-encoded at most every ``min_period_s``)."""

    def __init__(
        self,
        node: Any,
        camera: str = "agentview",
        topic_template: str = DEFAULT_TOPIC,
        min_period_s: float = 1.0,
    ) -> None:
        from sensor_msgs.msg import Image

        from fed_ros.ros.wire import qos

        if not float(min_period_s) >= 0.0:  # NaN too: it would never re-encode
            raise ValueError(f"min_period_s must be >= 0 s, got {min_period_s}")
        self.node, self.camera, self.template = node, camera, topic_template
        self.min_period_s = float(min_period_s)
        self._image_type, self._qos = Image, qos.sensor_qos(1)
        self._lock = threading.Lock()
        self._arrivals = 0  # frames taken, all robots: tells a new frame from the encoded one
        self._latest: dict[str, tuple[int, Any]] = {}  # robot -> (arrival, newest message)
        # robot -> (encoded at, arrival encoded, value): data URLs, larger PNGs
        self._urls: dict[str, tuple[float, int, str]] = {}
        self._large: dict[str, tuple[float, int, bytes]] = {}
        self._subs: dict[str, Any] = {}
        self.errors: dict[str, str] = {}  # robot -> why its last frame could not be shown

    def topic(self, robot_id: str) -> str:
        """The camera topic of ``robot_id``."""
        return self.template.format(robot=robot_id, camera=self.camera)

    def watch(self, robot_ids: Iterable[str]) -> None:
        """Subscribe to the cameras of robots not watched yet (the executor's thread)."""
        for rid in robot_ids:
            if rid in self._subs:
                continue
            self._subs[rid] = self.node.create_subscription(
                self._image_type, self.topic(rid), lambda msg, r=rid: self._keep(r, msg), self._qos
            )

    def _keep(self, robot_id: str, msg: Any) -> None:
        with self._lock:
            self._arrivals += 1
            self._latest[robot_id] = (self._arrivals, msg)

    def _due(self, cache: dict, now: float, only: str | None = None) -> dict[str, tuple[int, Any]]:
        """The robots (``only`` that one) whose newest frame ``cache`` lacks and whose entry is
        a period old; claimed for ``now`` under the lock, so concurrent pages encode it once."""
        due = {}
        with self._lock:
            for rid, (arrival, msg) in self._latest.items():
                if only is not None and rid != only:
                    continue
                at, encoded, value = cache.get(rid, (-1e9, 0, None))
                if arrival != encoded and now - at >= self.min_period_s:
                    due[rid] = (arrival, msg)
                    cache[rid] = (now, encoded, value)
        return due

    def _encode(self, robot_id: str, msg: Any, side: int) -> bytes | None:
        from fed_ros.ros.wire.images import msg_to_image

        try:
            rgb = msg_to_image(msg, desired_encoding="rgb8", backend="own")
            return png_bytes(thumbnail(rgb, side))
        except ValueError as exc:  # an encoding the page cannot show
            self.errors[robot_id] = str(exc)[:200]
            return None

    def data_urls(self) -> dict[str, str]:
        """Each robot's newest thumbnail (re-encoded at most every ``min_period_s``)."""
        now = time.monotonic()
        for rid, (arrival, msg) in self._due(self._urls, now).items():
            png = self._encode(rid, msg, THUMB_SIDE)
            if png is not None:
                url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
                with self._lock:
                    self._urls[rid] = (now, arrival, url)
        with self._lock:
            return {rid: url for rid, (_, _, url) in self._urls.items() if url is not None}

    def large_png(self, robot_id: str) -> bytes | None:
        """``robot_id``'s newest frame as a PNG of at most :data:`LARGE_SIDE` pixels a side
        (re-encoded at most every ``min_period_s``); None before its first frame."""
        now = time.monotonic()
        due = self._due(self._large, now, robot_id).get(robot_id)
        if due is not None:
            png = self._encode(robot_id, due[1], LARGE_SIDE)
            if png is not None:
                with self._lock:
                    self._large[robot_id] = (now, due[0], png)
        with self._lock:
            return self._large.get(robot_id, (0.0, 0, None))[2]

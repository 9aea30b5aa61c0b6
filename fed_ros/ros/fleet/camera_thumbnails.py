"""Camera thumbnails of `fed-ros status --web`: each robot's newest camera frame as a small PNG.

The status page is one self-contained file served by the standard library, so the frames travel
inside its JSON as ``data:image/png`` URLs. A frame is subscribed best effort, depth 1 (the
newest only; a monitor never slows a camera down), shrunk by striding to at most
:data:`THUMB_SIDE` pixels and encoded with :func:`png_bytes` (zlib, no image library): at most
once a second per robot, and only when a new frame came.

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
    h, w = rgb.shape[:2]
    stride = max(1, -(-max(h, w) // side))
    return np.ascontiguousarray(rgb[::stride, ::stride, :3])


def data_url(rgb: np.ndarray) -> str:
    """A thumbnail's PNG as a data URL for an <img> element."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(thumbnail(rgb))).decode("ascii")


class CameraThumbnails:
    """Subscribes to each watched robot's camera and keeps its newest frame as a data URL."""

    def __init__(
        self,
        node: Any,
        camera: str = "agentview",
        topic_template: str = DEFAULT_TOPIC,
        min_period_s: float = 1.0,
    ) -> None:
        from sensor_msgs.msg import Image

        from fed_ros.ros.wire import qos

        self.node, self.camera, self.template = node, camera, topic_template
        self.min_period_s = float(min_period_s)
        self._image_type, self._qos = Image, qos.sensor_qos(1)
        self._lock = threading.Lock()
        self._latest: dict[str, Any] = {}  # robot -> newest message (not decoded yet)
        self._urls: dict[str, tuple[float, str]] = {}  # robot -> (encoded at, data URL)
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
            self._latest[robot_id] = msg

    def data_urls(self) -> dict[str, str]:
        """Each robot's newest thumbnail (re-encoded at most every ``min_period_s``)."""
        from fed_ros.ros.wire.images import msg_to_image

        now = time.monotonic()
        with self._lock:
            fresh = {
                rid: msg
                for rid, msg in self._latest.items()
                if now - self._urls.get(rid, (-1e9, ""))[0] >= self.min_period_s
            }
            for rid in fresh:
                del self._latest[rid]
        for rid, msg in fresh.items():
            try:
                rgb = msg_to_image(msg, desired_encoding="rgb8", backend="own")
                url = data_url(rgb)
            except ValueError as exc:  # an encoding a thumbnail cannot show
                self.errors[rid] = str(exc)[:200]
                continue
            with self._lock:
                self._urls[rid] = (now, url)
        with self._lock:
            return {rid: url for rid, (_, url) in self._urls.items()}

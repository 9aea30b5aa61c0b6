"""Camera frames <-> mp4 for LeRobot ``video`` features, with PyAV (the ``dataset`` extra).

LeRobot v3 keeps one mp4 per camera and file (``videos/<feature>/chunk-000/file-000.mp4``) with
the episodes one after another; an episode's frames start at its ``from_timestamp``. Export
encodes H.264 in RGB (``libx264rgb``, crf 0): lossless, so a round trip keeps every pixel, where
lerobot's default (AV1, yuv420p, crf 30) changes pixels by up to ~250 on noise. A keyframe every
2 frames, as lerobot writes, keeps its seek-then-decode reads short. Import decodes any codec
FFmpeg in PyAV knows (lerobot's AV1 included) to RGB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fed_ros.core.extras import require

CODEC = "libx264rgb"
CODEC_OPTIONS = {"crf": "0", "g": "2"}


def _av() -> Any:
    return require("av", "dataset", "LeRobot video features")


class Mp4Writer:
    """One camera's mp4: episodes appended one after another at ``fps`` frames per second."""

    def __init__(self, path: Path, fps: int, height: int, width: int) -> None:
        av = _av()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.fps, self.frames = path, fps, 0
        self._container = av.open(str(path), "w")
        self._stream = self._container.add_stream(CODEC, rate=fps, options=dict(CODEC_OPTIONS))
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "rgb24"
        self._frame_type = av.VideoFrame

    def append(self, frames: NDArray[Any]) -> tuple[float, float]:
        """Encode (N, H, W, 3) uint8 frames; returns the episode's (from, to) seconds in the mp4."""
        start = self.frames
        for frame in frames:
            video_frame = self._frame_type.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            # Frame k of the file is shown at k / fps: the dataset's timestamps index it.
            video_frame.pts = self.frames
            for packet in self._stream.encode(video_frame):
                self._container.mux(packet)
            self.frames += 1
        return start / self.fps, self.frames / self.fps

    def close(self) -> None:
        """Flush the encoder and finish the file."""
        for packet in self._stream.encode():
            self._container.mux(packet)
        self._container.close()


def video_info(path: Path) -> dict[str, Any]:
    """The ``info`` of a video feature in ``meta/info.json``, read as lerobot reads it."""
    av = _av()
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {
            "video.height": stream.height,
            "video.width": stream.width,
            "video.codec": stream.codec.canonical_name,
            "video.pix_fmt": stream.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(stream.base_rate),
            "video.channels": 3,
            "has_audio": bool(container.streams.audio),
        }


def decode_frames(path: Path) -> tuple[NDArray[Any], NDArray[Any]]:
    """Every frame of an mp4 as (N, H, W, 3) uint8 RGB, and each frame's time in seconds."""
    av = _av()
    frames, times = [], []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24"))
            times.append(float(frame.pts * stream.time_base) if frame.pts is not None else np.nan)
    if not frames:
        raise ValueError(f"{path}: no video frames")
    return np.stack(frames), np.asarray(times)

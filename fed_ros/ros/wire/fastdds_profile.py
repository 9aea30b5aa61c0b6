"""The Fast DDS profile shipped with fed_ros (shared memory) and how a process opts into it."""

from __future__ import annotations

import os
from pathlib import Path

FASTDDS_PROFILE_NAME = "fastdds_shm.xml"


def fastdds_profile_path(name: str = FASTDDS_PROFILE_NAME) -> Path | None:
    """A Fast DDS profile shipped with fed_ros (default: the shared-memory one), if it exists."""
    candidates = [Path(__file__).resolve().parents[3] / "config" / name]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("fed_ros")) / "config" / name)
    except Exception:  # noqa: BLE001 - not installed as an ament package (dev tree / pip)
        pass
    for path in candidates:
        if path.is_file():
            return path
    return None


def apply_fastdds_profile(
    env: dict[str, str] | None = None, path: Path | None = None
) -> Path | None:
    """Point FASTDDS_DEFAULT_PROFILES_FILE at the SHM profile, only if the file exists.

    Why the check: a profile that fails to load makes Fast DDS fall back to multicast on
    the real network interface. Must run before rclpy.init (participants read it once).
    An existing setting is kept. Returns the profile in effect, or None.
    """
    target = os.environ if env is None else env
    if target.get("FASTDDS_DEFAULT_PROFILES_FILE"):
        current = Path(target["FASTDDS_DEFAULT_PROFILES_FILE"])
        return current if current.is_file() else None
    path = path or fastdds_profile_path()
    if path is None or not Path(path).is_file():
        return None
    target["FASTDDS_DEFAULT_PROFILES_FILE"] = str(path)
    return Path(path)

"""ROS_DOMAIN_IDs held exclusively on this machine (tests, benchmarks that start fleets).

Each id is an exclusive flock on a file under the temp directory, so parallel test runs,
benchmarks and their workers never share a DDS domain; the kernel drops the lock if the
holder dies. The test suite and `fed-ros bench robustness --protocol` draw from one pool.
"""

from __future__ import annotations

import contextlib
import fcntl
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path

DOMAIN_IDS = range(1, 102)
DOMAIN_LOCK_DIR = Path(tempfile.gettempdir()) / "fed_ros_ros_domains"


@contextlib.contextmanager
def exclusive_domain_id() -> Iterator[int]:
    """A ROS_DOMAIN_ID no other holder on this machine has, held until the block ends."""
    DOMAIN_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    ids = list(DOMAIN_IDS)
    random.SystemRandom().shuffle(ids)
    for domain in ids:
        handle = open(DOMAIN_LOCK_DIR / f"{domain}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield domain
        finally:
            handle.close()  # closing the file releases the lock
        return
    raise RuntimeError(
        f"every ROS domain id {DOMAIN_IDS.start}-{DOMAIN_IDS.stop - 1} is held "
        f"(locks in {DOMAIN_LOCK_DIR})"
    )

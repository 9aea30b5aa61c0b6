"""The robot node's worker thread: every long job (start-up demonstrations and registration, the
work of an announced round stage) runs here, one at a time and in order.

It stands apart from the node because its rules are about jobs, not ROS: a job that fails is
logged with its type and the node lives on for the next round; a shutdown ends the thread
quietly; a failed start-up is remembered (``failed``) so main() can exit 1 with the reason.
Subscriptions and services keep running on the executor while a job trains.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any

from fed_ros.ros import shutdown
from fed_ros.ros.arm.arm_client import EpisodeInterrupted
from fed_ros.ros.shutdown import ShutdownRequested

STARTUP = "startup"


class JobWorker:
    """Runs ``handlers[kind](arg)`` for each ``put(kind, arg)`` on one daemon thread."""

    def __init__(self, name: str, handlers: dict[str, Callable[[Any], None]], log: Any) -> None:
        self.handlers, self.log = handlers, log
        self.jobs: queue.Queue = queue.Queue()
        self.stop_event = threading.Event()
        self.failed = ""  # set when the start-up job failed: the node cannot serve the fleet
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, kind: str, arg: Any = None) -> None:
        self.jobs.put((kind, arg))

    def stop(self, timeout_s: float = 2.0) -> None:
        """Ask the thread to stop; its waits give up within shutdown.POLL_S."""
        self.stop_event.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _work(self) -> None:
        while not self.stop_event.is_set():
            try:
                kind, arg = self.jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self.handlers[kind](arg)
            except ShutdownRequested:
                return
            except EpisodeInterrupted as exc:  # learning switched off mid-episode: expected
                self.log.info(f"{kind}: {exc}")
            except Exception as exc:  # noqa: BLE001 - report, keep the node alive for the next round
                if self.stop_event.is_set() or shutdown.requested():
                    return  # e.g. a publisher whose context just went away: not an error
                self.log.error(
                    f"{kind} failed: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
                )
                if kind == STARTUP:
                    self.failed = f"startup failed: {exc}"

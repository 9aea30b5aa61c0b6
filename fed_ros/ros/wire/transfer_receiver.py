"""Model transfer, receiving side: a ``TransferReceiver`` both nodes use, and its ``Received``.

The server receives updates, a robot cluster models; the sending side is
:mod:`fed_ros.ros.wire.transfer`. The receiver stands alone because it holds what the sender
never needs: chunk assembly with size caps, bulk fetch on worker threads (retried with backoff
within the caller's time budget, resumed where it stopped), decode, and **the one check of a
payload's content**: manifest equal to the expected one (first chunk, before any byte is
collected), then finite values within range (after decoding). Every outcome is a
``fed_ros.core.checks.decisions.Decision`` with a code.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from fed_ros.core.checks.decisions import ACCEPTED, Decision, Limits, TRANSFER, UNREACHABLE
from fed_ros.core.rounds.delivery import RetrySchedule
from fed_ros.core.params import Manifest
from fed_ros.core.checks.payload_checks import check_payload_manifest, check_tensors
from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.chunk_assembler import (
    ChunkDropped,
    PayloadAssembler,
    PayloadRejected,
    TransferLimits,
    check_header,
)
from fed_ros.ros.wire.channels import bulk_channel_for
from fed_ros.ros.wire.chunk_assembler import encode_resend_request
from fed_ros.ros.wire.tensors import StateDict, decode_state_dict


@dataclass
class Received:
    """The outcome of one payload: accepted with its tensors, or rejected with a code and reason."""

    payload_id: str
    tag: Any  # what the node attached to the payload's first chunk (envelope, message)
    decision: Decision
    params: StateDict | None = None
    sha256: str = ""
    nbytes: int = 0


class TransferReceiver:
    """Receiving side: assembly with caps, bulk fetch, decode and the one payload check."""

    def __init__(
        self,
        expected_manifest: Manifest | None,
        limits: TransferLimits | None = None,
        *,
        value_limits: Limits | None = None,
        max_pending: int = 8,
        stall_timeout_s: float = 2.0,
        fetch_workers: int = 2,
        max_fetched: int = 4,
        fetch_retry: RetrySchedule | None = None,
        fetch_idle_timeout_s: float = 2.0,
        on_event: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.expected_manifest = expected_manifest
        self.limits = limits or TransferLimits()
        self.value_limits = value_limits or Limits()
        self.assembler = PayloadAssembler(
            self.limits, max_pending=max_pending, stall_timeout_s=stall_timeout_s, clock=clock
        )
        self.fetch_retry = fetch_retry or RetrySchedule(first_s=1.0, factor=2.0, max_s=8.0)
        self.fetch_idle_timeout_s = fetch_idle_timeout_s
        self._on_event = on_event or (lambda text: None)
        self._clock = clock
        self._tags: dict[str, Any] = {}
        self._fetching: set[str] = set()
        # Chunks dropped because they do not belong to the upload they name (foreign_chunk):
        # counted, the latest few kept for the node's audit log (drops()).
        self.dropped_chunks = 0
        self._drops: deque[Received] = deque(maxlen=64)
        self._done: queue.Queue[Received] = queue.Queue()
        if max_fetched < fetch_workers:
            raise ValueError(f"max_fetched={max_fetched} < fetch_workers={fetch_workers}")
        # Bulk payloads being fetched plus those decoded and not yet taken by completed(): a
        # fetch waits for a permit, so a node admitting slower than the workers fetch holds
        # max_fetched decoded models, not every robot's (measured: 7.5 GB of heap at 100
        # robots x 11M parameters before this bound; the senders keep their bytes meanwhile).
        self._fetch_permits = threading.Semaphore(max_fetched)
        self._closed = threading.Event()
        self._pool = ThreadPoolExecutor(
            max_workers=fetch_workers, thread_name_prefix="fed_ros-fetch"
        )
        # payload id -> the newest bulk offer of a fetch in progress: a sender that restarted
        # (a killed server republishing its committed model) offers the same bytes elsewhere.
        self._offers: dict[str, TensorPayload] = {}

    def busy(self, payload_id: str) -> bool:
        """Whether ``payload_id`` is being assembled or fetched (its first chunk was admitted)."""
        return payload_id in self._tags

    def offer(
        self, payload: TensorPayload, tag: Any = None, retry_for_s: float | None = None
    ) -> Received | None:
        """Take one chunk or bulk control message.

        Returns the outcome when the payload is decided now.

        A bulk payload is fetched on a worker thread, retried with backoff for ``retry_for_s``
        seconds (the rest of the round) when its sender is unreachable; see :meth:`completed`.
        """
        pid = payload.payload_id
        if pid not in self._tags:
            if self.assembler.is_finished(pid):
                return None  # a late chunk of a payload already decided
            decision = self.check_first(payload)
            if not decision:
                return Received(pid, tag, decision)
            self._tags[pid] = tag
            if payload.bulk_uri:
                self._fetching.add(pid)
                self._offers[pid] = payload
                self._pool.submit(self._fetch_bounded, pid, payload, retry_for_s)
                return None
        if payload.bulk_uri:
            held = self._offers.get(pid)
            if (
                held is not None
                and payload.bulk_uri != held.bulk_uri
                and payload.sha256 == held.sha256
                and int(payload.total_bytes) == int(held.total_bytes)
            ):
                # the same bytes offered elsewhere: fetch from there next
                self._offers[pid] = payload
                self._on_event(
                    f"payload {pid}: now offered at {payload.bulk_uri.rsplit('/', 1)[0]}"
                )
            return None  # a repeated control message of a fetch in progress
        try:
            complete = self.assembler.add(payload)
        except ChunkDropped as exc:  # not part of this upload: dropped, the upload goes on
            self.dropped_chunks += 1
            self._drops.append(
                Received(pid, self._tags.get(pid), Decision(False, exc.code, str(exc)[:300]))
            )
            return None
        except PayloadRejected as exc:
            return self._decided(pid, Decision(False, exc.code, str(exc)))
        if complete is None:
            return None
        return self._decode(
            pid,
            complete.manifest,
            complete.encoding,
            complete.scales,
            complete.data,
            complete.sha256,
        )

    def check_first(self, payload: TensorPayload) -> Decision:
        """Check the header of a payload's first chunk.

        Caps and structure, then the expected manifest (before any byte).
        """
        try:
            manifest = check_header(payload, self.limits)
        except PayloadRejected as exc:
            return Decision(False, exc.code, str(exc))
        if self.expected_manifest is None:
            return ACCEPTED
        return check_payload_manifest(
            manifest, int(payload.total_bytes), int(payload.encoding), self.expected_manifest
        )

    def _decode(
        self,
        pid: str,
        manifest: Manifest,
        encoding: int,
        scales: Any,
        data: np.ndarray,
        sha256: str,
    ) -> Received:
        try:
            params = decode_state_dict(
                manifest, encoding, data, np.asarray(scales, np.float32), copy=True
            )
        except ValueError as exc:
            return self._decided(pid, Decision(False, TRANSFER, f"payload {pid!r}: {exc}"))
        expected = self.expected_manifest if self.expected_manifest is not None else manifest
        decision = check_tensors(params, expected, self.value_limits.max_abs_value)
        if not decision:
            return self._decided(
                pid, Decision(False, decision.code, f"payload {pid!r}: {decision.reason}")
            )
        tag = self._tags.pop(pid, None)
        return Received(pid, tag, ACCEPTED, params=params, sha256=sha256, nbytes=int(data.nbytes))

    def _decided(self, pid: str, decision: Decision) -> Received:
        tag = self._tags.pop(pid, None)
        self.assembler.discard(pid)
        return Received(pid, tag, decision)

    def _fetch_bounded(self, pid: str, payload: TensorPayload, retry_for_s: float | None) -> None:
        """Worker thread: pull the bytes once a permit is free (see ``max_fetched``).

        An unreachable sender is retried with backoff; a retry resumes where it stopped.
        """
        while not self._fetch_permits.acquire(timeout=0.25):
            if self._closed.is_set():
                return
        if not self._fetch(pid, payload, retry_for_s):
            self._fetch_permits.release()  # closed: nothing was put for completed() to take

    def _fetch(self, pid: str, payload: TensorPayload, retry_for_s: float | None) -> bool:
        """Pull, decode and check one payload; put the outcome for :meth:`completed` (True),
        or nothing when the receiver closed (False)."""
        give_up = self._clock() + (retry_for_s if retry_for_s is not None else 60.0)
        attempt = 0
        try:
            fetch = bulk_channel_for(payload.bulk_uri).fetch(payload, limits=self.limits)
            while True:
                try:
                    data = fetch.run(idle_timeout_s=self.fetch_idle_timeout_s, max_retries=1)
                    break
                # TimeoutError is the channel's "sender unreachable": retried (channels.py)
                except TimeoutError as exc:
                    # the sender restarted elsewhere: go there now
                    if self._switch_offer(pid, payload):
                        payload, attempt = self._offers[pid], 0
                        give_up = self._clock() + (retry_for_s if retry_for_s is not None else 60.0)
                        fetch = bulk_channel_for(payload.bulk_uri).fetch(
                            payload, limits=self.limits
                        )
                        continue
                    attempt += 1
                    wait = self.fetch_retry.delay(attempt)
                    if self._closed.is_set() or self._clock() + wait > give_up:
                        self._done.put(self._decided(pid, Decision(False, UNREACHABLE, str(exc))))
                        return True
                    self._on_event(
                        f"payload {pid}: {exc}; retrying in {wait:g} s "
                        f"({len(fetch.received)}/{len(fetch.ranges)} chunks kept)"
                    )
                    end = time.monotonic() + wait  # real time, as the fetch itself
                    while time.monotonic() < end and not self._switch_offer(pid, payload):
                        if self._closed.wait(min(0.25, max(0.0, end - time.monotonic()))):
                            return False
            result = self._decode(pid, *_header_parts(payload), data, payload.sha256)
        except PayloadRejected as exc:
            result = self._decided(pid, Decision(False, exc.code, str(exc)))
        except Exception as exc:  # noqa: BLE001 - any other failure rejects this payload only
            result = self._decided(
                pid, Decision(False, TRANSFER, f"bulk fetch failed: {type(exc).__name__}: {exc}")
            )
        finally:
            self._fetching.discard(pid)
            self._offers.pop(pid, None)
        self._done.put(result)
        return True

    def _switch_offer(self, pid: str, payload: TensorPayload) -> bool:
        """Whether a newer offer of ``pid`` names another endpoint than ``payload``."""
        newer = self._offers.get(pid)
        return newer is not None and newer.bulk_uri != payload.bulk_uri

    def drops(self) -> list[Received]:
        """Chunks dropped as foreign since the last call.

        At most the latest 64 are kept; all are counted.
        """
        out = list(self._drops)
        self._drops.clear()
        return out

    def completed(self) -> list[Received]:
        """Bulk payloads decided since the last call (call from the node's callback group)."""
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out
            self._fetch_permits.release()

    def resend_requests(self) -> list[str]:
        """Resend requests for stalled chunked payloads (publish on the sender's resend topic)."""
        return [
            encode_resend_request(pid, missing)
            for pid, missing in self.assembler.stalled().items()
            if missing
        ]

    def discard(self, payload_id: str) -> None:
        """Forget a payload being received (its round ended); a later chunk of it starts over."""
        self._tags.pop(payload_id, None)
        self.assembler.forget(payload_id)

    def close(self) -> None:
        """Stop the fetch workers."""
        self._closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _header_parts(payload: TensorPayload) -> tuple[Manifest, int, np.ndarray]:
    from fed_ros.ros.wire.tensors import manifest_from_msgs

    return (
        manifest_from_msgs(payload.manifest),
        int(payload.encoding),
        np.asarray(payload.scales, np.float32),
    )

"""Transfer channels: how a model payload travels. One registry; a new channel is one entry here.

``ros``: the payload in chunked ``TensorPayload`` messages on the topic itself (DDS); always there.
A *bulk* channel: the topic carries one control chunk naming a URI, and the bytes travel out of
band. ``zmq`` is a ZeroMQ ROUTER with a per-transfer secret (:mod:`fed_ros.ros.wire.bulk`,
fetched by :mod:`fed_ros.ros.wire.bulk_fetch`).
``auto``: ``ros`` below ``bulk_threshold_bytes``, else :data:`AUTO_BULK`.

A new bulk channel (say HTTP or Zenoh) is one :class:`BulkChannel` in :data:`BULK_CHANNELS`:
a server factory (``offer(data) -> uri``, ``withdraw(uri)``, ``close()``), a fetch factory
(``run(idle_timeout_s=, max_retries=) -> uint8 array`` of bytes it verified against the
payload's sha256, ``received``, ``ranges``, raising a ``TimeoutError`` while the sender cannot be
reached, which the receiver retries, and ``PayloadRejected`` on a refusal or bad bytes) and the
URI prefix its servers hand out. The sender, the receiver, the node parameters
(``transfer_channel``) and the fleet plan take the names from here. Nothing here imports ROS or
zmq until a channel is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Payloads at least this large go over the bulk channel when the channel is "auto"; smaller
# ones travel inside ROS messages (one round trip fewer, nothing else to open).
BULK_THRESHOLD_BYTES = 1 << 20


@dataclass(frozen=True)
class BulkChannel:
    """One out-of-band channel for payload bytes."""

    name: str
    uri_prefix: str  # every URI its servers hand out starts with this
    server: Callable[[float], Any]  # ttl_s -> server: offer(data) -> uri, withdraw(uri), close()
    fetch: Callable[..., Any]  # (TensorPayload, limits=TransferLimits) -> fetch: run(...) -> bytes


def _zmq_server(ttl_s: float) -> Any:
    from fed_ros.ros.wire.bulk import BulkServer

    return BulkServer(ttl_s=ttl_s)


def _zmq_fetch(payload: Any, limits: Any) -> Any:
    from fed_ros.ros.wire.bulk_fetch import BulkFetch

    return BulkFetch(payload, limits=limits)


BULK_CHANNELS: dict[str, BulkChannel] = {
    "zmq": BulkChannel("zmq", "tcp://", _zmq_server, _zmq_fetch),
}
# The bulk channel "auto" picks for large payloads (measured: docs/transport.md, DEFAULT_TRANSPORT).
AUTO_BULK = "zmq"
CHANNELS: tuple[str, ...] = ("auto", "ros", *BULK_CHANNELS)


def choose_channel(
    channel: str, total_bytes: int, threshold_bytes: int = BULK_THRESHOLD_BYTES
) -> str:
    """The channel of one payload: as configured, or by size when ``channel`` is 'auto'."""
    if channel not in ("auto", "ros") and channel not in BULK_CHANNELS:
        raise ValueError(
            f"transfer_channel must be one of {('auto', 'ros', *BULK_CHANNELS)}, got {channel!r}"
        )
    if channel == "auto":
        return AUTO_BULK if total_bytes >= threshold_bytes else "ros"
    return channel


def bulk_channel_for(uri: str) -> BulkChannel:
    """The bulk channel that serves ``uri``; ValueError naming the URI when none does."""
    for channel in BULK_CHANNELS.values():
        if uri.startswith(channel.uri_prefix):
            return channel
    raise ValueError(
        f"no bulk channel serves {uri[:80]!r} (known: "
        f"{', '.join(f'{c.name} {c.uri_prefix}' for c in BULK_CHANNELS.values())})"
    )

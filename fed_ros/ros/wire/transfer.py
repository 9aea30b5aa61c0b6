"""Model transfer, sending side: a ``TransferSender`` both nodes use (with its ``Outgoing`` offers).

The server sends cluster models and receives updates; a robot does the opposite. Each side
holds one sender and one receiver (:mod:`fed_ros.ros.wire.transfer_receiver`); the nodes only
wrap chunks in their message type and publish. Delivery bookkeeping (acknowledgements,
re-sends, idempotent receipt) is the pure ``fed_ros.core.rounds.delivery``.

The sender encodes a state dict, chooses the channel (``transfer_channel``: the registry in
:mod:`fed_ros.ros.wire.channels`, and the size threshold), produces chunk messages (ROS chunks,
or one control message whose ``bulk_uri`` carries a fresh 128-bit secret) and answers resend
requests.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fed_ros.msg import TensorPayload
from fed_ros.ros.wire.chunk_assembler import decode_resend_request
from fed_ros.ros.wire.channels import BULK_CHANNELS, BULK_THRESHOLD_BYTES, choose_channel
from fed_ros.ros.wire.chunk_sender import ChunkedSender, DEFAULT_CHUNK_BYTES
from fed_ros.ros.wire.tensors import EncodedPayload, encode_state_dict


@dataclass
class Outgoing:
    """One payload offered to the other side: its chunks, channel and what wraps them."""

    payload_id: str
    encoded: EncodedPayload
    chunker: ChunkedSender
    channel: str  # "ros" or a bulk channel's name (channels.BULK_CHANNELS)
    # message fields the node wraps each chunk with
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def bulk_uri(self) -> str:
        """The bulk channel address (with its secret), or '' for ROS chunks."""
        return self.chunker.bulk_uri

    def chunks(self) -> list[TensorPayload]:
        """Every chunk message (one control message on the bulk channel)."""
        return list(self.chunker.chunks())


class TransferSender:
    """Sending side: encode, choose the channel, produce chunks or a bulk offer, answer resends."""

    def __init__(
        self,
        channel: str = "auto",
        *,
        bulk_threshold_bytes: int = BULK_THRESHOLD_BYTES,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        bulk_ttl_s: float = 3600.0,
        keep: int = 16,
    ) -> None:
        choose_channel(channel, 0, 1)  # validates the name
        if bulk_threshold_bytes < 0 or chunk_bytes <= 0 or keep < 1:
            raise ValueError(
                f"invalid sender settings: bulk_threshold_bytes={bulk_threshold_bytes}, "
                f"chunk_bytes={chunk_bytes}, keep={keep}"
            )
        self.channel = channel
        self.bulk_threshold_bytes = int(bulk_threshold_bytes)
        self.chunk_bytes = int(chunk_bytes)
        self.bulk_ttl_s = bulk_ttl_s
        self.keep = keep
        self._servers: dict[str, Any] = {}  # bulk channel -> its server (opened on first use)
        self._out: OrderedDict[str, Outgoing] = OrderedDict()
        self._lock = threading.Lock()  # prepare (worker thread) vs resend (executor thread)

    def prepare(
        self, params: Mapping[str, np.ndarray] | EncodedPayload, payload_id: str, **meta: Any
    ) -> Outgoing:
        """Encode (unless already encoded) and offer a payload.

        ``meta`` is kept for wrapping its chunks.
        """
        encoded = params if isinstance(params, EncodedPayload) else encode_state_dict(params)
        return self._offer(encoded, payload_id, meta)

    def reissue(self, old: Outgoing, payload_id: str, **meta: Any) -> Outgoing:
        """The same bytes under a new payload id.

        For a re-announced round: not re-encoded, not retrained.
        """
        self.withdraw(old.payload_id)
        return self._offer(old.encoded, payload_id, meta)

    def _offer(self, encoded: EncodedPayload, payload_id: str, meta: dict[str, Any]) -> Outgoing:
        channel = choose_channel(self.channel, encoded.total_bytes, self.bulk_threshold_bytes)
        uri = ""
        if channel in BULK_CHANNELS:
            server = self._servers.get(channel)
            if server is None:
                server = self._servers[channel] = BULK_CHANNELS[channel].server(self.bulk_ttl_s)
            uri = server.offer(encoded.data)  # a fresh secret per transfer
        out = Outgoing(
            payload_id,
            encoded,
            ChunkedSender(encoded, payload_id, self.chunk_bytes, bulk_uri=uri),
            channel,
            dict(meta),
        )
        with self._lock:
            self._out[payload_id] = out
            while len(self._out) > self.keep:
                _, old = self._out.popitem(last=False)
                self._withdraw_uri(old)
        return out

    def get(self, payload_id: str) -> Outgoing | None:
        """A payload still offered."""
        with self._lock:
            return self._out.get(payload_id)

    def resend(self, request: str) -> tuple[Outgoing, list[TensorPayload]] | None:
        """Answer a resend request: (the payload, only the requested chunks); None if not ours.

        Raises ValueError naming the problem for a malformed request or bad chunk indices.
        """
        pid, indices = decode_resend_request(request)
        out = self.get(pid)
        if out is None:
            return None
        return out, out.chunker.resend(indices)

    def withdraw(self, payload_id: str) -> None:
        """Stop offering a payload (its bulk secret stops working)."""
        with self._lock:
            out = self._out.pop(payload_id, None)
        if out is not None:
            self._withdraw_uri(out)

    def withdraw_all(self) -> None:
        """Stop offering every payload (e.g. new cluster models replace the old ones)."""
        for pid in list(self._out):
            self.withdraw(pid)

    def _withdraw_uri(self, out: Outgoing) -> None:
        server = self._servers.get(out.channel)
        if out.bulk_uri and server is not None:
            server.withdraw(out.bulk_uri)

    def bulk_server(self, channel: str) -> Any:
        """The server of a bulk channel, once this sender opened it (None before)."""
        return self._servers.get(channel)

    def close(self) -> None:
        """Close the bulk servers that were opened."""
        for server in self._servers.values():
            server.close()
        self._servers.clear()

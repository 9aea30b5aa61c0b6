"""What a robot takes from the fleet server: cluster models and update-resend requests.

Everything here is checked before it is kept: the server's signature over a model's header
(chunk list, bulk address, members) on its first chunk, bounds on every field, and the
model itself (manifest, finite values, digest, no rollback) once assembled. Control
messages that fail a check (a fake server, over-long fields, a request flood) are refused,
counted per kind and logged at a bounded rate, never obeyed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fed_ros.core.checks import bounds
from fed_ros.core.checks.bounds import RateLimiter
from fed_ros.core.encodings import DELTA_WIRE_IDS
from fed_ros.ros.wire.tensors import ENCODING_NAMES
from fed_ros.ros.wire.transfer_receiver import Received


class RobotDownlink:
    """Cluster models in (signature, assembly, validation, cache) and update-resend requests
    answered."""

    def __init__(
        self,
        *,
        models: Any,
        models_in: Any,
        uplink: Any,
        server_key: Any,
        log_transfer: Callable[..., None],
        log: Any,
    ) -> None:
        # The model cache and the receiving transfer, the update sender (answers resend
        # requests), the server's key (None: an unsigned fleet), the transfer log, the logger.
        self.models, self.models_in, self.uplink, self.server_key = (
            models,
            models_in,
            uplink,
            server_key,
        )
        self.log_transfer, self.log = log_transfer, log
        self.refused_control: dict[
            str, int
        ] = {}  # kind -> control messages refused (fake server, bounds)
        self._refusal_log = RateLimiter(per_s=1.0, burst=5)
        self._resend_limit = RateLimiter(per_s=10.0, burst=20)  # update_resend requests answered

    def refuse(self, kind: str, reason: str) -> None:
        """A control message not from our server (or over its bounds): counted, logged at a bounded
        rate."""
        self.refused_control[kind] = self.refused_control.get(kind, 0) + 1
        if self._refusal_log.allow(time.monotonic()):
            self.log.warning(
                f"{kind} refused ({self.refused_control[kind]} so far): {reason[:300]}"
            )

    def on_update_resend(self, msg) -> None:
        """The server misses chunks of our update: answered when signed by the server, at a bounded
        rate."""
        from fed_ros.ros.wire.signed import verify_json

        if len(msg.data) > bounds.MAX_RESEND_REQUEST_CHARS:
            return self.refuse("update_resend", f"request of {len(msg.data)} chars")
        if self.server_key is not None:
            why = verify_json(msg.data, "update_resend", lambda obj: self.server_key)
            if why is not None:
                return self.refuse("update_resend", why)
        if not self._resend_limit.allow(time.monotonic()):
            return self.refuse("update_resend", "rate limit (10/s, burst 20)")
        self.uplink.on_resend(msg)

    def on_cluster_model(self, msg) -> None:
        """One chunk (or bulk offer) of a cluster model."""
        cid, round_idx = int(msg.cluster_id), int(msg.round)
        if self.server_key is not None and (
            msg.payload.bulk_uri or not self.models_in.busy(msg.payload.payload_id)
        ):
            # First chunk of a model: the server's signature over its header (chunk list, bulk
            # address, members) before anything is kept; later chunks must match that header.
            # Every bulk offer is checked: a restarted server's offer redirects a fetch in progress.
            why = self.check_model_header(msg)
            if why is not None:
                return self.refuse("cluster_models", why)
        with self.models.lock:
            held = self.models.entries.get(cid)
        if held is not None and held[0] >= round_idx:
            return  # older or the same version (latched history, resend)
        result = self.models_in.offer(msg.payload, tag=msg)
        if result is not None:
            self.store_model(result)

    def check_model_header(self, msg) -> str | None:
        """Why a model's first chunk is refused (bounds, server signature over its header), or
        None."""
        from fed_ros.core.checks.payload_checks import validate_cluster_model
        from fed_ros.ros.wire.chunk_sender import transfer_digest_of

        why = bounds.oversized(
            {
                "signature": (msg.signature, bounds.SIGNATURE_BYTES),
                "payload_id": (msg.payload.payload_id, bounds.MAX_ID_CHARS),
                "bulk_uri": (msg.payload.bulk_uri, bounds.MAX_URI_CHARS),
                "chunk_sha256": (msg.payload.chunk_sha256, bounds.MAX_CHUNK_DIGEST_BYTES),
            }
        ) or bounds.oversized_items(
            "member_robot_ids", msg.member_robot_ids, 4096, bounds.MAX_ID_CHARS
        )
        if why is not None:
            return why
        if int(msg.payload.encoding) in DELTA_WIRE_IDS:
            name = ENCODING_NAMES.get(int(msg.payload.encoding), int(msg.payload.encoding))
            return (
                f"cluster {int(msg.cluster_id)} round {int(msg.round)}: encoding {name} is a "
                "delta, for updates only; a cluster model is a whole model"
            )
        d = validate_cluster_model(
            cluster_id=int(msg.cluster_id),
            round_idx=int(msg.round),
            params=None,
            expected_manifest=None,
            total_bytes=int(msg.payload.total_bytes),
            payload_sha256=msg.payload.sha256,
            signature=bytes(msg.signature),
            server_public_key=self.server_key,
            transfer=transfer_digest_of(msg.payload),
            members=list(msg.member_robot_ids),
        )
        return (
            None
            if d
            else f"cluster {int(msg.cluster_id)} round {int(msg.round)} ({d.code}): {d.reason}"
        )

    def store_model(self, result: Received) -> None:
        """An assembled model: validated and cached (ModelCache.store), or refused with its
        reason."""
        from fed_ros.ros.wire.chunk_sender import transfer_digest_of

        msg = result.tag
        cid, round_idx, members, sha256 = (
            int(msg.cluster_id),
            int(msg.round),
            list(msg.member_robot_ids),
            msg.payload.sha256,
        )
        decision = result.decision and self.models.store(
            cid,
            round_idx,
            result.params,
            members,
            total_bytes=int(msg.payload.total_bytes),
            sha256=sha256,
            received_sha256=result.sha256,
            signature=bytes(msg.signature),
            server_public_key=self.server_key,
            transfer=transfer_digest_of(msg.payload),
        )
        if decision.code == "stale":
            return
        if not decision:
            self.log.warning(
                f"cluster {cid} model for round {round_idx} rejected ({decision.code}): "
                f"{decision.reason}"
            )
            return
        self.log_transfer(
            kind="cluster_model_received",
            cluster_id=cid,
            round=round_idx,
            sha256=sha256,
            bytes=result.nbytes,
            members=members,
        )
        self.log.info(
            f"received cluster {cid} model for round {round_idx} ({result.nbytes} B, {sha256[:12]})"
        )

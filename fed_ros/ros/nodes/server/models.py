"""The fleet server's cluster models out: publishing each round's models and answering resends.

After a commit the server publishes every cluster's model on the latched ``cluster_models``
topic (chunked, or a header with a bulk address), each signed over its round, cluster, sha256,
members and transfer header; the previous round's models stop being served. A robot that
missed chunks asks on ``model_resend``: the request is rate limited, bounded and (with
``require_signatures``) must be signed by an allow-listed robot. Its collaborators are explicit:
the coordinator (current models and memberships), the transfer sender, a publish callable,
the server's keys, the live parameters, a clock for stamps and a logger.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fed_ros.core.checks import bounds
from fed_ros.ros.wire.round_msgs import cluster_model_msg
from fed_ros.ros.wire.signed import verify_json
from fed_ros.ros.wire.tensors import StateDict, decode_state_dict, encode_state_dict


class ClusterModelPublisher:
    """Publishes the coordinator's cluster models and re-sends their chunks on request."""

    def __init__(
        self,
        *,
        coord: Any,
        models_out: Any,
        publish: Callable[[Any], None],
        signer: Any,
        allow_list: Any,
        params: Callable[[], Any],
        now_msg: Callable[[], Any],
        log: Any,
    ) -> None:
        self.coord, self.models_out, self.publish = coord, models_out, publish
        self.signer, self.allow_list, self.params = signer, allow_list, params
        self.now_msg, self.log = now_msg, log
        self._resend_limit = bounds.RateLimiter(per_s=10.0, burst=20)
        # model_resend requests refused: unsigned, forged or over the rate limit
        self.resend_refused = 0
        self.published_round = -1  # the round whose models are on the topic (-1: none yet)
        # The models of the last published rounds as the robots decoded them (the bases of delta
        # updates; buffered rounds take updates trained from earlier rounds' models too).
        self._sent: dict[int, dict[int, StateDict]] = {}

    def publish_models(self) -> None:
        """Every cluster's current model, for the coordinator's round."""
        round_idx = self.coord.round_idx
        members: dict[int, list[str]] = {}
        for rid, membership in self.coord.memberships.items():
            for cid, weight in membership:
                if weight > 0:
                    members.setdefault(int(cid), []).append(rid)
        self.models_out.withdraw_all()  # the previous round's models stop being served
        stamp = self.now_msg()
        keep = round_idx - self.coord.stale_rounds
        self._sent = {r: models for r, models in self._sent.items() if r >= keep and r != round_idx}
        sent = self._sent[round_idx] = {}
        for cid, model in sorted(self.coord.cluster_models.items()):
            encoded = encode_state_dict(model, self.params().model_encoding)
            sent[int(cid)] = decode_state_dict(
                encoded.manifest, encoded.encoding, encoded.data, encoded.scales, copy=True
            )
            out = self.models_out.prepare(
                encoded,
                f"cluster_{cid}/r{round_idx}/{encoded.sha256[:12]}",
                cluster_id=cid,
                round_idx=round_idx,
                member_robot_ids=sorted(members.get(cid, [])),
            )
            # Signed: round, cluster, sha256, members and the header (chunk list, bulk address).
            out.meta["signature"] = (
                self.signer.sign_cluster_model(
                    round_idx,
                    cid,
                    encoded.sha256,
                    transfer=out.chunker.transfer_digest(),
                    members=out.meta["member_robot_ids"],
                )
                if self.signer is not None
                else b""
            )
            for chunk in out.chunks():
                self.publish(cluster_model_msg(chunk, stamp=stamp, **out.meta))
        self.published_round = round_idx
        self.log.info(
            f"published {len(self.coord.cluster_models)} cluster model(s) for round {round_idx}"
        )

    def sent_model(self, round_idx: int, cluster_id: int) -> StateDict | None:
        """Cluster ``cluster_id``'s model of ``round_idx`` as the robots decoded it, if this
        server published it and still keeps it (the base of a delta update)."""
        return self._sent.get(int(round_idx), {}).get(int(cluster_id))

    def on_model_resend(self, msg) -> None:
        if not self._resend_limit.allow(time.monotonic()):
            self.resend_refused += 1
            self.log.warning(
                f"model resend over the rate limit ({self.resend_refused} refused)",
                throttle_duration_sec=5,
            )
            return
        if len(msg.data) > bounds.MAX_RESEND_REQUEST_CHARS:
            self.log.warning(
                f"model resend request of {len(msg.data)} chars refused "
                f"(bound {bounds.MAX_RESEND_REQUEST_CHARS})"
            )
            return
        # Only allow-listed robots may ask (signed by their key).
        if self.params().require_signatures:
            why = verify_json(
                msg.data,
                "model_resend",
                lambda obj: self.allow_list.public_key(str(obj.get("robot_id", ""))[:256]),
            )
            if why is not None:
                self.resend_refused += 1
                self.log.warning(
                    f"model resend request refused ({self.resend_refused} so far): {why[:200]}"
                )
                return
        try:
            answer = self.models_out.resend(msg.data)
        except ValueError as exc:
            self.log.warning(f"bad model resend request: {str(exc)[:200]}")
            return
        if answer is not None:  # None: an old round's model; the robot gets the current one
            out, chunks = answer
            for chunk in chunks:
                self.publish(cluster_model_msg(chunk, **out.meta))

"""A robot's model traffic with the server, both ways, as one object.

Cluster models in (chunks or bulk fetches, checked against the policy's manifest, stored in
the ModelCache), updates out (kept until acknowledged, re-sent on a schedule), and the resend
requests in both directions. The node owns the publishers and subscriptions (its interface is
listed in one file) and calls ``tick()`` from its timer; everything with state lives here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from std_msgs.msg import String

from fed_ros.ros import shutdown
from fed_ros.ros.nodes.robot.model_cache import ModelCache
from fed_ros.ros.nodes.robot.downlink import RobotDownlink
from fed_ros.ros.nodes.robot.uplink import UpdateUplink
from fed_ros.ros.wire.signed import sign_json
from fed_ros.ros.wire.transfer_receiver import TransferReceiver


class TransferLog:
    """``transfers.jsonl``: one JSON line per transfer event (sent, acknowledged, re-sent,
    model received...), stamped and flushed at once so a crash loses none."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")

    def __call__(self, **entry: Any) -> None:
        entry["time"] = round(time.time(), 3)
        self._file.write(json.dumps(entry) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class RobotTransfer:
    """``uplink`` (updates out), ``models_in`` + ``downlink`` (cluster models in) and ``models``
    (what arrived), over the node's ``update_pub`` and ``model_resend_pub``; ``log_transfer``
    writes the transfer log in ``data_dir``."""

    def __init__(
        self,
        params,
        manifest,
        *,
        update_pub,
        model_resend_pub,
        signer,
        server_key,
        data_dir: Path,
        log: Any,
        wait_for_server: Callable[[], None],
    ) -> None:
        self.robot_id, self.signer = params.robot_id, signer
        self.model_resend_pub = model_resend_pub
        self.log_transfer = log_transfer = TransferLog(data_dir / "transfers.jsonl")
        self.uplink = UpdateUplink(  # updates out, kept until acknowledged
            update_pub,
            params.robot_id,
            signer=signer,
            transfer_channel=params.transfer_channel,
            bulk_threshold_bytes=params.bulk_threshold_bytes,
            retry_s=params.update_retry_s,
            log_transfer=log_transfer,
            log=log,
            wait_for_server=wait_for_server,
        )
        # Cluster models in: the one payload check (the manifest), at most 8 transfers pending.
        self.models_in = TransferReceiver(
            manifest,
            max_pending=8,
            on_event=shutdown.unless_stopping(lambda text: log.warning(text)),
        )
        self.models = ModelCache()  # the receive path (downlink) stores into it
        self.downlink = RobotDownlink(
            models=self.models,
            models_in=self.models_in,
            uplink=self.uplink,
            server_key=server_key,
            log_transfer=log_transfer,
            log=log,
        )

    def tick(self) -> None:
        """Ask for missing model chunks, store completed models, re-send unacknowledged updates."""
        if shutdown.requested():
            return  # peers stop with us: their fetches and our re-sends failing now are no fault
        for request in self.models_in.resend_requests():
            self.model_resend_pub.publish(
                String(data=sign_json(request, "model_resend", self.signer, self.robot_id))
            )
        for result in self.models_in.completed():
            self.downlink.store_model(result)
        self.uplink.resend_due()

    def close(self) -> None:
        self.uplink.close()
        self.models_in.close()
        self.log_transfer.close()

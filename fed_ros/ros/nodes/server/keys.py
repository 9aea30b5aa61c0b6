"""The fleet server's keys: who may join, with which key, and how the server signs what it sends.

Built once from the server parameters (``allowed_keys_file``, ``private_key_file``,
``require_signatures``): the allow list and the robots' public keys for the roster, the replay
guard for signed robot messages (persisted in ``state_dir``), the server's signer, and the
registration guard that makes a Register prove possession of its allow-listed key. The update
intake, the registration desk and the model publisher share this one object, so every check
uses the same keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fed_ros.ros.configuration.fleet_params import ServerParams


@dataclass(frozen=True)
class ServerKeys:
    """The server's security state (every field None when the fleet is not signed)."""

    allow_list: Any = None  # fed_ros.core.security.auth.AllowList
    allowed_keys: dict[str, bytes] | None = None  # robot id -> public key, for the roster
    replay_guard: Any = None  # fed_ros.core.security.replay.ReplayGuard
    signer: Any = None  # fed_ros.core.security.auth.Signer: the server's own key
    registration_guard: Any = None  # fed_ros.core.security.registration.RegistrationGuard


def load_server_keys(params: ServerParams) -> ServerKeys:
    """Read the key files the parameters name (ServerParams refuses require_signatures without
    allowed_keys_file)."""
    allow_list = allowed_keys = replay_guard = signer = registration_guard = None
    if params.allowed_keys_file:
        from fed_ros.core.security.auth import AllowList
        from fed_ros.core.security.replay_file import persistent_guard

        allow_list = AllowList.from_yaml(params.allowed_keys_file)
        allowed_keys = {rid: allow_list.public_key(rid) for rid in allow_list.robot_ids}
        # Kept in the state directory with the round state: a restarted server still refuses
        # the nonces it accepted before (a captured update replayed after a crash).
        replay_guard = persistent_guard(Path(params.state_dir))
    if params.private_key_file:
        from fed_ros.core.security.auth import Signer

        signer = Signer.from_file(params.private_key_file)
    # With require_signatures a Register must prove possession of the allow-listed key
    # (signature over its claim + timestamp + nonce); without it only the key must match.
    if params.require_signatures and allow_list is not None:
        from fed_ros.core.security.registration import RegistrationGuard

        registration_guard = RegistrationGuard(allow_list)
    return ServerKeys(
        allow_list=allow_list,
        allowed_keys=allowed_keys,
        replay_guard=replay_guard,
        signer=signer,
        registration_guard=registration_guard,
    )

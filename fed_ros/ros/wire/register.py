"""Register requests: the one place a robot (node, scripted test robot, attacker) builds one.

With a signer the request carries the proof of possession of the robot's key that a server
with ``require_signatures`` demands (fed_ros.core.registration): timestamp, fresh nonce and
the signature over the whole claim. Without a signer it is the unauthenticated request.
"""
from __future__ import annotations

from collections.abc import Sequence

from fed_ros.core.auth import Signer
from fed_ros.core.registration import RegistrationClaim, sign_registration
from fed_ros.srv import Register


def register_request(robot_id: str, *, tasks: Sequence[str] = (), cameras: Sequence[str] = (),
                     action_dim: int = 4, has_gpu: bool = False, num_samples: int = 0,
                     signer: Signer | None = None, timestamp_ns: int | None = None) -> Register.Request:
    """A Register request for ``robot_id``; signed (key, timestamp, nonce, signature) when ``signer``."""
    request = Register.Request(robot_id=robot_id, tasks=list(tasks), cameras=list(cameras),
                               action_dim=int(action_dim), has_gpu=bool(has_gpu), num_samples=int(num_samples))
    if signer is not None:
        claim = RegistrationClaim(robot_id=robot_id, public_key=signer.public_key, tasks=tuple(tasks),
                                  cameras=tuple(cameras), action_dim=int(action_dim), has_gpu=bool(has_gpu),
                                  num_samples=int(num_samples))
        proof = sign_registration(signer, claim, timestamp_ns=timestamp_ns)
        request.public_key = list(signer.public_key)
        request.timestamp_ns = proof.timestamp_ns
        request.nonce = list(proof.nonce)
        request.signature = list(proof.signature)
    return request

"""Register requests: the one place a robot (node, scripted test robot, attacker) builds one.

With a signer the request carries the proof of possession of the robot's key that a server
with ``require_signatures`` demands (fed_ros.core.security.registration): timestamp, fresh nonce and
the signature over the whole claim. Without a signer it is the unauthenticated request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from fed_ros.core.security.auth import Signer
from fed_ros.core.security.registration import RegistrationClaim, sign_registration
from fed_ros.ros import shutdown
from fed_ros.ros.wire.service_calls import call_client_until_answered, threaded
from fed_ros.srv import Register

# How long one registration try waits for its answer before asking again (a signed registration
# is verified and the roster written to disk: well under a second on an idle server).
REGISTER_ATTEMPT_S = 10.0


def register_request(
    robot_id: str,
    *,
    tasks: Sequence[str] = (),
    cameras: Sequence[str] = (),
    action_dim: int = 4,
    has_gpu: bool = False,
    num_samples: int = 0,
    signer: Signer | None = None,
    timestamp_ns: int | None = None,
) -> Register.Request:
    """A Register request for ``robot_id``; signed (key, timestamp, nonce, signature) when
    ``signer``."""
    request = Register.Request(
        robot_id=robot_id,
        tasks=list(tasks),
        cameras=list(cameras),
        action_dim=int(action_dim),
        has_gpu=bool(has_gpu),
        num_samples=int(num_samples),
    )
    if signer is not None:
        claim = RegistrationClaim(
            robot_id=robot_id,
            public_key=signer.public_key,
            tasks=tuple(tasks),
            cameras=tuple(cameras),
            action_dim=int(action_dim),
            has_gpu=bool(has_gpu),
            num_samples=int(num_samples),
        )
        proof = sign_registration(signer, claim, timestamp_ns=timestamp_ns)
        request.public_key = list(signer.public_key)
        request.timestamp_ns = proof.timestamp_ns
        request.nonce = list(proof.nonce)
        request.signature = list(proof.signature)
    return request


def register_with_fleet(
    client, make_request: Callable[[], Register.Request], *, timeout_s: float, stop: threading.Event
) -> Register.Response:
    """Register (asking again while unanswered); RuntimeError if refused, TimeoutError after
    ``timeout_s``, ShutdownRequested when ``stop`` is set.

    Waits for the service first (a request sent before any server is discovered is lost), then
    asks with `call_client_until_answered`, which also survives a response Fast DDS dropped.
    ``make_request`` builds each attempt afresh: a signed request needs a fresh timestamp and nonce.
    """
    deadline = time.monotonic() + timeout_s
    while not client.wait_for_service(timeout_sec=1.0):
        shutdown.check(stop)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no fleet server answered within {timeout_s:.0f} s")
    shutdown.check(stop)
    left = max(deadline - time.monotonic(), 1.0)
    try:
        response = call_client_until_answered(
            client,
            make_request,
            threaded(stop),
            attempt_s=min(REGISTER_ATTEMPT_S, left),
            timeout_s=left,
        )
    except TimeoutError:
        raise TimeoutError(f"no fleet server answered within {timeout_s:.0f} s") from None
    if not response.accepted:
        raise RuntimeError(f"registration refused: {response.reason}")
    return response

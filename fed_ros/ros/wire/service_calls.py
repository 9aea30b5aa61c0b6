"""Service calls: one try with a deadline (`call_service`), or ask again while unanswered
(`call_until_answered`), which survives a response Fast DDS dropped.

Why: rmw_fastrtps sends a response only once the *server* has matched the client's reply
reader, and waits for that at most its writer's max_blocking_time (100 ms by default). A request
that arrives before the server's side of discovery is done gets "failed to send response
(timeout): client will not receive response" logged on the server and nothing on the client,
which then waits for ever (ros2/rmw_fastrtps#704, ros2/rclcpp#2760). ``wait_for_service`` does not
prevent it: it reports what the *client* has discovered. Seen in CI under load: a
``set_parameters`` call went unanswered for 30 s while the server had applied it.

Asking again is only for requests whose repetition is harmless: idempotent ones (set a value,
enable, query), or ones built afresh per attempt (a signed registration needs a fresh nonce each
time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rclpy.task import Future

from fed_ros.ros import shutdown

#: Spin or wait until ``future`` is done or ``seconds`` passed; True when it is done.
Wait = Callable[[Future, float], bool]


def threaded(stop: threading.Event | None = None) -> Wait:
    """A `Wait` for nodes an executor spins in another thread (Ctrl-C or ``stop`` end it:
    ShutdownRequested)."""

    def wait(future: Future, seconds: float) -> bool:
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        return shutdown.wait_for(done, seconds, stop)

    return wait


def spinning(spin_once: Callable[[float], object]) -> Wait:
    """A `Wait` for callers that spin the node themselves (``executor.spin_once`` as
    ``spin_once``)."""

    def wait(future: Future, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while not future.done() and time.monotonic() < end:
            spin_once(min(0.05, max(end - time.monotonic(), 0.0)))
        return future.done()

    return wait


def call_service(client, request, timeout_s: float, stop: threading.Event | None = None):
    """One call from a node spun in another thread; the response, or None (the try dropped) after
    ``timeout_s``."""
    future = client.call_async(request)
    try:
        answered = threaded(stop)(future, timeout_s)
    finally:
        if not future.done():
            client.remove_pending_request(future)
    return future.result() if answered else None


def call_until_answered(
    send: Callable[[], Future],
    wait: Wait,
    *,
    attempt_s: float,
    timeout_s: float,
    what: str,
    abandon: Callable[[Future], object] | None = None,
):
    """``send()`` a request until one is answered; the response, or TimeoutError after
    ``timeout_s``.

    Each try waits ``attempt_s`` (longer than the service takes to answer, or a slow answer is
    asked for again); ``abandon`` (e.g. ``client.remove_pending_request``) drops an unanswered
    try, so a late response to it is ignored.
    """
    if not 0 < attempt_s <= timeout_s:
        raise ValueError(f"attempt_s must be in (0, timeout_s={timeout_s}], got {attempt_s}")
    deadline = time.monotonic() + timeout_s
    tries = 0
    while True:
        future = send()
        tries += 1
        if wait(future, min(attempt_s, max(deadline - time.monotonic(), 0.0))):
            return future.result()
        if abandon is not None:
            abandon(future)
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"no answer to {what} in {timeout_s:g} s ({tries} tries of {attempt_s:g} s)"
            )


def call_client_until_answered(client, request, wait: Wait, *, attempt_s: float, timeout_s: float):
    """`call_until_answered` for an rclpy service client: ``request`` is a Request, or a function
    building one per try; an unanswered try is dropped from the client's pending requests."""
    make = request if callable(request) else (lambda: request)
    return call_until_answered(
        lambda: client.call_async(make()),
        wait,
        attempt_s=attempt_s,
        timeout_s=timeout_s,
        what=client.srv_name,
        abandon=client.remove_pending_request,
    )

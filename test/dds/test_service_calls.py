"""call_until_answered over DDS: an unanswered try is asked again, the answer is the latest try's.

The server here answers its first request late (after the client gave up on it), the way a
response Fast DDS dropped looks to a client; the client must ask again and return the answer
to its own last request, not to an abandoned one.
"""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.ros


@pytest.fixture
def late_first_answer(ros_env):
    """A Trigger service whose first answer comes after ``first_delay.wait`` (released by the
    test)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from std_srvs.srv import Trigger

    server_ctx, client_ctx = rclpy.Context(), rclpy.Context()
    rclpy.init(context=server_ctx)
    rclpy.init(context=client_ctx)
    server = rclpy.create_node("late_server", context=server_ctx)
    received: list[int] = []
    release = threading.Event()

    def on_trigger(_request, response):
        received.append(len(received) + 1)
        if len(received) == 1:
            release.wait(30.0)  # the first answer is late: the client has given up on it
        response.success, response.message = True, f"call {received[-1]}"
        return response

    server.create_service(Trigger, "late", on_trigger)
    executor = SingleThreadedExecutor(context=server_ctx)
    executor.add_node(server)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    client_node = rclpy.create_node("caller", context=client_ctx)
    client_executor = SingleThreadedExecutor(context=client_ctx)
    client_executor.add_node(client_node)
    client = client_node.create_client(Trigger, "/late")
    try:
        assert client.wait_for_service(timeout_sec=30.0)
        yield client, client_executor, received, release
    finally:
        release.set()
        client_node.destroy_node()
        rclpy.try_shutdown(context=client_ctx)
        executor.shutdown()
        rclpy.try_shutdown(context=server_ctx)
        thread.join(timeout=10.0)
        server.destroy_node()


def test_an_unanswered_try_is_asked_again_and_the_latest_answer_returned(late_first_answer):
    from std_srvs.srv import Trigger
    from fed_ros.ros.wire.service_calls import call_until_answered, spinning

    client, executor, received, release = late_first_answer
    sent: list[int] = []

    def send():
        sent.append(len(sent) + 1)
        if len(sent) == 2:
            release.set()  # the server now answers: the late answer to try 1 first, then try 2
        return client.call_async(Trigger.Request())

    wait = spinning(lambda s: executor.spin_once(timeout_sec=s))
    answer = call_until_answered(
        send,
        wait,
        attempt_s=1.0,
        timeout_s=60.0,
        what="late",
        abandon=client.remove_pending_request,
    )
    assert len(sent) >= 2
    assert (
        answer.message == f"call {len(sent)}"
    )  # the answer to the last try, not the late one to try 1
    assert received[: len(sent)] == list(range(1, len(sent) + 1))


def test_no_answer_within_the_timeout_names_the_call_and_the_tries(late_first_answer):
    from std_srvs.srv import Trigger
    from fed_ros.ros.wire.service_calls import call_until_answered, spinning

    client, executor, _received, _release = (
        late_first_answer  # never released: try 1 blocks the server
    )
    wait = spinning(lambda s: executor.spin_once(timeout_sec=s))
    with pytest.raises(
        TimeoutError, match=r"no answer to the late service in 1\.5 s \(2 tries of 1 s\)"
    ):
        call_until_answered(
            lambda: client.call_async(Trigger.Request()),
            wait,
            attempt_s=1.0,
            timeout_s=1.5,
            what="the late service",
            abandon=client.remove_pending_request,
        )


def test_attempt_longer_than_the_timeout_is_refused_naming_it():
    from fed_ros.ros.wire.service_calls import call_until_answered

    with pytest.raises(ValueError, match=r"attempt_s must be in \(0, timeout_s=5\], got 10"):
        call_until_answered(lambda: None, lambda f, s: True, attempt_s=10, timeout_s=5, what="x")


def test_call_service_one_try_none_when_unanswered_then_the_answer(late_first_answer):
    from std_srvs.srv import Trigger
    from fed_ros.ros.wire.service_calls import call_service

    client, executor, _received, release = late_first_answer
    spinner = threading.Thread(target=executor.spin, daemon=True)  # a node spun in another thread
    spinner.start()
    try:
        assert (
            call_service(client, Trigger.Request(), 1.0) is None
        )  # the server holds try 1: no retry here
        release.set()
        assert call_service(client, Trigger.Request(), 30.0).message == "call 2"
    finally:
        executor.shutdown()
        spinner.join(timeout=10.0)

"""Clean shutdown of a fed_ros node process: Ctrl-C / SIGTERM set a flag that every wait observes.

rclpy's own handler chains to Python's default SIGINT handler, so a KeyboardInterrupt lands
wherever the main thread happens to be: inside a physics step (robosuite's numba code then
died with ``SystemError: CPUDispatcher(...) returned a result with an exception set``), or in
a callback halfway through publishing. Instead, :func:`init` starts rclpy without its signal
handlers and installs one that only sets a flag. A node's ``main()`` spins until the flag is
set, then stops its workers and destroys the node; every blocking wait in the ROS layer (arm
client, recorder, robot worker) polls :func:`requested` at least every half second and raises
:class:`ShutdownRequested`, which the workers treat as a normal end, not an error.

Every node ``main()`` is wrapped in :func:`node_main`: once the node's own teardown is done
(node destroyed, rclpy shut down, files closed, workers told to stop) the process ends with
``os._exit`` after flushing every output stream, skipping interpreter finalization. Measured
under ``ros2 launch`` (load ~12, 2 cores): the nodes' own teardown took 0.06-1.2 s and
finalization (module teardown, C++ destructors of rclpy / Fast DDS / torch / MuJoCo, no
Python frame left) another 0.5-2.1 s; at load ~25 that overran launch's 5 s and the nodes
were SIGTERMed. ``FED_ROS_SHUTDOWN_TRACE=1`` prints when the signal came and when the
process exits.
"""

from __future__ import annotations

import faulthandler
import functools
import io
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, NoReturn

_REQUESTED = threading.Event()
_SIGNALLED_AT: list[
    float
] = []  # time.monotonic() of the first request (for FED_ROS_SHUTDOWN_TRACE)
POLL_S = 0.25  # how often a wait looks at the flag; keeps Ctrl-C-to-exit well under launch's 5 s
# A process still alive this long after the signal prints every thread's stack to stderr, just
# before launch's SIGTERM (5 s): a teardown that hangs says where. Seen once in a loaded
# random-order run: the fleet server outlived SIGINT and SIGTERM and was SIGKILLed.
STACKS_AFTER_S = 4.0


class ShutdownRequested(Exception):
    """Raised by a wait when the process is shutting down (the caller just returns)."""


def request() -> None:
    """Ask every wait in this process to give up (what the signal handler does)."""
    if not _SIGNALLED_AT:
        _SIGNALLED_AT.append(time.monotonic())
    _REQUESTED.set()


def requested() -> bool:
    """True once SIGINT/SIGTERM arrived (or :func:`request` was called)."""
    return _REQUESTED.is_set()


def check(stop: threading.Event | None = None) -> None:
    """Raise :class:`ShutdownRequested` if the process (or ``stop``, a node's own flag) is
    stopping."""
    if _REQUESTED.is_set() or (stop is not None and stop.is_set()):
        raise ShutdownRequested()


def sleep(seconds: float, stop: threading.Event | None = None) -> None:
    """``time.sleep`` that raises :class:`ShutdownRequested` as soon as shutdown is requested."""
    deadline = time.monotonic() + seconds
    while True:
        check(stop)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        _REQUESTED.wait(min(remaining, POLL_S))


def wait_for(event: threading.Event, timeout: float, stop: threading.Event | None = None) -> bool:
    """``event.wait(timeout)`` that raises :class:`ShutdownRequested` on shutdown."""
    deadline = time.monotonic() + timeout
    while True:
        check(stop)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return event.is_set()
        if event.wait(min(remaining, POLL_S)):
            return True


def wait_for_service(client, timeout: float, stop: threading.Event | None = None) -> bool:
    """``client.wait_for_service(timeout)`` in short slices, raising on shutdown."""
    deadline = time.monotonic() + timeout
    while True:
        check(stop)
        remaining = deadline - time.monotonic()
        if client.wait_for_service(timeout_sec=max(0.0, min(remaining, POLL_S))):
            return True
        if remaining <= 0:
            return False


def unless_stopping(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` that does nothing once shutdown is requested.

    For progress/warning callbacks of background work (a bulk fetch retrying a peer that
    stopped with us, an update re-send): after Ctrl-C their peers vanish on purpose, and
    "unreachable" or "re-sending" lines would read like a fault.
    """

    @functools.wraps(fn)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        if _REQUESTED.is_set():
            return None
        return fn(*args, **kwargs)

    return quiet


def flush_outputs() -> None:
    """Flush Python's logging handlers and stdout/stderr, then every C stdio stream (rcutils)."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing left to save
            pass
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def exit_process(code: int) -> NoReturn:
    """End the process now with ``code``: flush outputs, then ``os._exit`` (no interpreter
    finalization).

    Call only after the node's own teardown (node destroyed, rclpy shut down, files closed,
    worker threads told to stop): nothing after this runs, not atexit hooks nor finalizers.
    """
    if os.environ.get("FED_ROS_SHUTDOWN_TRACE") and _SIGNALLED_AT:
        sys.stderr.write(
            f"[shutdown] {os.path.basename(sys.argv[0])} pid {os.getpid()}: exit {code} "
            f"{time.monotonic() - _SIGNALLED_AT[0]:.2f} s after the signal\n"
        )
    flush_outputs()
    os._exit(code)


def node_main(main: Callable[..., int | None]) -> Callable[..., NoReturn]:
    """Decorator for a node's ``main()``: its return value (None = 0) becomes the exit code via
    :func:`exit_process`; an uncaught exception prints its traceback and exits 1, as Python would.
    The undecorated function stays available as ``__wrapped__``."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> NoReturn:
        try:
            result = main(*args, **kwargs)
            code = 0 if result is None else int(result)
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - reported like the interpreter would, then exit 1
            import traceback

            traceback.print_exc()
            code = 1
        exit_process(code)

    return run


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM set the flag (main thread only, as Python requires)."""

    def handler(_signum, _frame) -> None:
        if not _REQUESTED.is_set():
            try:
                faulthandler.dump_traceback_later(STACKS_AFTER_S, exit=False)
            except (
                RuntimeError,
                ValueError,
                io.UnsupportedOperation,
            ):  # no usable stderr: nothing to print to
                pass
        request()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def init(args: list[str] | None = None) -> None:
    """``rclpy.init`` without rclpy's signal handlers, and ours installed instead."""
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    install_signal_handlers()

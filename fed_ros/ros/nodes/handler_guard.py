"""No handler can crash a node: subscription/service callbacks wrapped so a failure is logged
with its exception type, counted, and the node keeps serving.

Not a blanket swallow: every caught error is logged at ERROR with the handler name, the
exception type and message (truncated: hostile input must not flood the log) and counted
per handler; ``on_error`` lets the node also put it in its audit log. Service handlers get
a ``fallback`` that fills the response (e.g. ``accepted=False`` with the reason).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

MAX_LOGGED_CHARS = 300  # of the exception message; the type is always logged in full


class HandlerGuard:
    """Wraps node callbacks; ``failures`` counts caught exceptions per handler name."""

    def __init__(
        self, node: Any, on_error: Callable[[str, BaseException], None] | None = None
    ) -> None:
        self._node = node
        self._on_error = on_error
        self._lock = threading.Lock()
        self.failures: dict[str, int] = {}

    def wrap(
        self,
        name: str,
        fn: Callable[..., Any],
        fallback: Callable[[tuple, BaseException], Any] | None = None,
    ) -> Callable[..., Any]:
        """``fn`` that logs, counts and survives any Exception (``fallback(args, exc)`` is returned
        then)."""

        def guarded(*args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - logged with its type and counted below
                self.report(name, exc)
                return fallback(args, exc) if fallback is not None else None

        guarded.__name__ = getattr(fn, "__name__", name)
        return guarded

    def report(self, name: str, exc: BaseException) -> None:
        """Count and log one failure of handler ``name``."""
        with self._lock:
            count = self.failures[name] = self.failures.get(name, 0) + 1
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {where.filename.rsplit('/', 1)[-1]}:{where.lineno}" if where else ""
        # One call site, one severity (rclpy refuses a call site that changes severity).
        self._node.get_logger().error(
            f"handler {name} failed ({type(exc).__name__}{at}): {str(exc)[:MAX_LOGGED_CHARS]!r}; "
            f"node keeps serving ({count} failure(s) of this handler)"
        )
        if self._on_error is not None:
            try:
                self._on_error(name, exc)
            except Exception as err:  # noqa: BLE001 - the audit log itself failed: log that too
                self._node.get_logger().error(
                    f"handler {name}: recording the failure failed "
                    f"({type(err).__name__}): {str(err)[:MAX_LOGGED_CHARS]!r}"
                )

    @property
    def total(self) -> int:
        """All caught failures."""
        with self._lock:
            return sum(self.failures.values())


def refuse_service(args: tuple, exc: BaseException) -> Any:
    """Service fallback for responses with ``ok``/``message`` (Record, EvaluatePolicy): refused,
    with the type."""
    response = args[1]
    response.ok = False
    response.message = f"handler failed ({type(exc).__name__}): {str(exc)[:MAX_LOGGED_CHARS]}"
    return response

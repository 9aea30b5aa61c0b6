"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``):
no websocket client needed, only the standard library. A test opens a page, runs JavaScript in
it, clicks with real mouse events, reads every request the page made (the Network domain) and
takes screenshots; the browser and its helper processes are killed with their session.

    with Chromium(CHROMIUM) as browser:
        page = browser.open("http://127.0.0.1:8765/", width=1100, height=900)
        page.wait_for("document.querySelectorAll('circle').length > 0", 20)
        page.click("img")
        png = page.screenshot()
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import subprocess
import time
from typing import Any


class CdpError(RuntimeError):
    """A DevTools command answered with an error, or the browser went away."""


class Chromium:
    """One headless Chromium process; commands and events as JSON, NUL-terminated, on fds 3/4."""

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def pipes_on_3_and_4() -> None:
            # Chromium reads commands from fd 3 and writes answers to fd 4. Copied to fds >= 10
            # first, so a pipe end that happened to get fd 3 or 4 is not overwritten; dup2
            # makes 3 and 4 inheritable, every other descriptor of ours is close-on-exec.
            r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
            w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        # --no-sandbox: the sandbox refuses to run as root (CI); the pages are our own.
        argv = [
            executable,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            argv,
            preexec_fn=pipes_on_3_and_4,
            close_fds=False,  # only fds 3 and 4 are inheritable (PEP 446)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []  # every event received, in order

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("no answer from Chromium in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise CdpError(f"Chromium closed its pipe (exit {self.proc.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """One command; its result (events that arrive meanwhile are kept in ``events``)."""
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            command["sessionId"] = session
        os.write(self._to_browser, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise CdpError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def open(self, url: str, width: int, height: int) -> "Page":
        """A new tab of ``width`` x ``height`` CSS pixels, network log on, ``url`` loaded."""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        page = Page(self, session)
        page.send("Network.enable")
        page.send("Page.enable")
        page.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        page.send("Page.navigate", url=url)
        # Navigation is asynchronous: until it commits, expressions run in about:blank.
        page.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            self.timeout,
        )
        return page

    def close(self) -> None:
        """Ask the browser to quit, then kill its whole session (renderers, GPU, zygote)."""
        try:
            if self.proc.poll() is None:
                self.send("Browser.close")
                self.proc.wait(timeout=10)
        except (CdpError, OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Page:
    """One tab: evaluate JavaScript, wait for a condition, click, screenshot, its requests."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """A command to this tab."""
        return self.browser.send(method, self.session, **params)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (JSON-serialisable; promises awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float) -> Any:
        """Poll ``expression`` until it is truthy (its value) or raise after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value, error = self.evaluate(expression), ""
            except CdpError as exc:  # e.g. the document is being replaced by a navigation
                value, error = None, f" (last: {exc})"
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:g} s waiting for {expression}{error}"
                )
            time.sleep(0.2)

    def click(self, selector: str) -> None:
        """A real left click (mouse pressed and released) at the middle of the element."""
        box = self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def key(self, key: str) -> None:
        """A key pressed and released (e.g. "Escape")."""
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=key)

    def screenshot(self) -> bytes:
        """The viewport as PNG bytes."""
        return base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])

    def requested_urls(self) -> list[str]:
        """Every URL this tab asked the network for so far (Network.requestWillBeSent)."""
        return [
            e["params"]["request"]["url"]
            for e in self.browser.events
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == self.session
        ]

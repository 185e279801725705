"""Headless Chromium for the tests that look at a page as a person would: open a local file,
measure its elements with the browser's own layout, and take a screenshot.

Chromium is driven over `--remote-debugging-pipe` (the DevTools protocol on file descriptors
3 and 4, NUL-separated JSON): no port is opened, nothing leaves the machine. The flags keep a
fresh profile from reaching for the network (updates, sync, QUIC).

A test asks for the `chromium` fixture (in conftest.py's plugin list via this module): on a
machine without Chromium it skips, in CI (CI=true) it fails, like the other services.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support import CI, DEADLINE_S

__all__ = ["Browser", "chromium_binary", "chromium"]

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-quic", "--disable-extensions", "--disable-default-apps",
         "--hide-scrollbars", "--mute-audio", "--remote-debugging-pipe")

_PLACE_FDS = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
              "os.execv(sys.argv[3], sys.argv[3:])")


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless Chromium with one page; `open(path)` loads a local file."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000):
        self._profile = tempfile.mkdtemp(prefix="bmadtest-chromium-")
        to_child, self._write = os.pipe()  # fd 3 in the child: what it reads
        self._read, from_child = os.pipe()  # fd 4 in the child: what it writes
        argv = [binary, *FLAGS, f"--user-data-dir={self._profile}",
                f"--window-size={width},{height}", "about:blank"]
        # The protocol wants exactly fds 3 and 4: a small Python step puts the pipes there and
        # becomes Chromium.
        self._log = Path(self._profile) / "chromium.log"
        with open(self._log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _PLACE_FDS, str(to_child), str(from_child), *argv],
                pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        os.close(to_child)
        os.close(from_child)
        self._buffer = b""
        self._next_id = 0
        self._session = None
        page = next(t for t in self._call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self._session = self._call("Target.attachToTarget", targetId=page["targetId"],
                                   flatten=True)["sessionId"]
        self._call("Page.enable")

    def _send(self, method: str, params: dict) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if self._session is not None and not method.startswith("Target."):
            message["sessionId"] = self._session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its pipe: "
                                   + self._log.read_text(errors="replace")[-2000:])
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _call(self, method: str, **params):
        wanted = self._send(method, params)
        while True:
            message = self._receive()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, path: Path) -> None:
        self._call("Page.navigate", url=path.resolve().as_uri())
        self.evaluate("new Promise(done => document.readyState === 'complete' ? done(1) :"
                      " window.addEventListener('load', () => done(1)))")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self._call("Runtime.evaluate", expression=expression, returnByValue=True,
                            awaitPromise=True, timeout=int(DEADLINE_S * 1000))
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, until: str | None = None) -> Path:
        """The whole page (not only the window) as a PNG; with `until` (a CSS selector), the
        page down to that element."""
        size = self.evaluate("[document.documentElement.scrollWidth,"
                             " document.documentElement.scrollHeight]")
        if until is not None:
            size[1] = self.evaluate(f"document.querySelector({json.dumps(until)})"
                                    ".getBoundingClientRect().top + window.scrollY")
        data = self._call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1})
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)
        shutil.rmtree(self._profile, ignore_errors=True)


@pytest.fixture
def chromium():
    """A headless Chromium page (`Browser`); skipped without Chromium here, a failure in CI."""
    binary = chromium_binary()
    if binary is None:
        if CI:
            pytest.fail("chromium is not installed (CI=true: .ci/run installs it with apt-get)")
        pytest.skip("chromium is not installed here; in CI (CI=true) this is a failure")
    browser = Browser(binary)
    try:
        yield browser
    finally:
        browser.close()

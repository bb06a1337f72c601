"""Headless Chromium driven over the DevTools protocol: the browser in which the HTML report's
tests (tests/privileged/test_html_*.py) and bench/report load it. Chromium runs as root with
--no-sandbox (what root needs), a fresh profile, and nothing that talks to the
network. Readiness is signalled, never slept on: DevToolsActivePort appears
when the browser listens; the page sets window.__pslat.ready when every plot
has been drawn (reports/html_template.py).
"""
from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path("/tmp/pslat-test-artifacts")   # outside the repo: screenshots to look at


def chromium_missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return "chromium is not installed (scripts/setup.sh installs Debian's chromium)"
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "websocket-client is not installed (pyproject dependency; run scripts/setup.sh)"
    return None


@dataclass
class PageResult:
    load_s: float                   # navigate -> every plot drawn
    state: dict                     # window.__pslat
    exceptions: list = field(default_factory=list)
    console_errors: list = field(default_factory=list)
    screenshot: Path | None = None
    texts: dict = field(default_factory=dict)


class Browser:
    def __init__(self, tmp: Path, width: int = 1400, height: int = 2000):
        self.profile = tmp / "chromium-profile"
        self.profile.mkdir(parents=True, exist_ok=True)
        self.width, self.height = width, height
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--mute-audio", f"--user-data-dir={self.profile}",
             "--remote-debugging-port=0", "--remote-allow-origins=*", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited: {self.proc.stderr.read().decode(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not write DevToolsActivePort within 30 s")
            time.sleep(0.05)
        self.port = int(port_file.read_text().split()[0])
        self._id = 0

    def _target(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        return pages[0]["webSocketDebuggerUrl"]

    def open(self, url: str, timeout_s: float = 60, init_script: str | None = None,
             screenshot: Path | None = None, texts: dict | None = None,
             evals: dict | None = None) -> PageResult:
        """Load `url`, wait until the report says it is ready, collect errors (and a screenshot,
        the text of the CSS selectors in `texts`, and the values of the expressions in `evals`,
        read once every plot is drawn)."""
        import websocket
        ws = websocket.create_connection(self._target(), timeout=timeout_s, suppress_origin=True)
        events: list[dict] = []

        def call(method: str, **params):
            self._id += 1
            ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == self._id:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg.get("result", {})
                events.append(msg)

        try:
            for m in ("Runtime.enable", "Log.enable", "Page.enable"):
                call(m)
            call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                 deviceScaleFactor=1, mobile=False)
            if init_script:
                call("Page.addScriptToEvaluateOnNewDocument", source=init_script)
            t0 = time.perf_counter()
            call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            state = {}
            while time.monotonic() < deadline:
                r = call("Runtime.evaluate", expression="JSON.stringify(window.__pslat || null)", returnByValue=True)
                state = json.loads(r["result"].get("value") or "null") or {}
                if state.get("ready"):
                    break
                time.sleep(0.02)
            load_s = time.perf_counter() - t0
            got = {}
            for name, sel in (texts or {}).items():
                r = call("Runtime.evaluate", returnByValue=True,
                         expression=f"Array.from(document.querySelectorAll({json.dumps(sel)}))"
                                    ".map(e => e.textContent).join('\\n')")
                got[name] = r["result"].get("value", "")
            for name, expr in (evals or {}).items():
                r = call("Runtime.evaluate", expression=f"JSON.stringify({expr})", returnByValue=True)
                got[name] = json.loads(r["result"].get("value") or "null")
            shot = None
            if screenshot is not None:
                r = call("Page.captureScreenshot", format="png")
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(r["data"]))
                shot = screenshot
            # drain what arrived meanwhile
            ws.settimeout(0.2)
            try:
                while True:
                    events.append(json.loads(ws.recv()))
            except Exception:
                pass
        finally:
            ws.close()
        exc = [e["params"]["exceptionDetails"] for e in events if e.get("method") == "Runtime.exceptionThrown"]
        errs = [e["params"]["entry"] for e in events if e.get("method") == "Log.entryAdded"
                and e["params"]["entry"].get("level") == "error"]
        errs += [e["params"] for e in events if e.get("method") == "Runtime.consoleAPICalled"
                 and e["params"].get("type") in ("error", "assert")]
        return PageResult(load_s=load_s, state=state, exceptions=exc, console_errors=errs, screenshot=shot,
                          texts=got)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

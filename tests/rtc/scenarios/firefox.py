"""Headless Firefox (Debian's firefox-esr) opens the page and makes a call.

Firefox is driven over WebDriver BiDi, the remote protocol built into Firefox itself (no
geckodriver, no Playwright build of Firefox): a websocket, JSON commands. Firefox fetches its
H.264 plugin (OpenH264) from the network, which this machine has not got, so the call is expected
to negotiate VP8: this scenario is also the real-browser test of the server's VP8 fallback.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import re
import tempfile
from pathlib import Path

import websockets

from common import HOST, PAGE_STATS_JS, page_url, start_server, tiny_live_pipeline
from support import emit

FIREFOX = "/usr/bin/firefox-esr"
PREFS = {
    "media.navigator.streams.fake": True,  # a generated tone as the microphone
    "media.navigator.permission.disabled": True,
    "media.peerconnection.ice.loopback": True,  # offer 127.0.0.2 (the namespace's only address)
    "media.peerconnection.ice.obfuscate_host_addresses": False,
    "media.peerconnection.ice.default_address_only": False,
    "media.autoplay.default": 0,
    "media.autoplay.blocking_policy": 0,
    "dom.securecontext.allowlist": HOST,
    "media.gmp-manager.updateEnabled": False,  # no plugin downloads (offline)
    "browser.shell.checkDefaultBrowser": False,
    "datareporting.policy.dataSubmissionEnabled": False,
}


class Bidi:
    """The few WebDriver BiDi commands the scenario needs."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws, self.ids = ws, itertools.count(1)

    async def call(self, method: str, **params: object) -> dict:
        msg_id = next(self.ids)
        await self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
            if msg.get("id") == msg_id:
                if msg.get("type") == "error":
                    raise RuntimeError(f"{method}: {msg.get('error')}: {msg.get('message')}")
                return msg["result"]

    async def js(self, context: str, expression: str) -> object:
        r = await self.call(
            "script.evaluate",
            expression=expression,
            target={"context": context},
            awaitPromise=True,
            serializationOptions={"maxObjectDepth": 3},
        )
        if r["type"] == "exception":
            raise RuntimeError(f"page script failed: {r['exceptionDetails'].get('text')}")
        return decode(r["result"])


def decode(value: dict) -> object:
    """BiDi remote value -> plain Python (primitives, arrays, objects)."""
    kind = value["type"]
    if kind in ("undefined", "null"):
        return None
    if kind == "array":
        return [decode(v) for v in value.get("value", [])]
    if kind == "object":
        return {k: decode(v) for k, v in value.get("value", [])}
    return value.get("value")


async def launch(profile: Path) -> tuple[asyncio.subprocess.Process, str]:
    """Start Firefox with a BiDi port; returns the process and its websocket URL."""
    # Firefox offers only its "default" address (the source of the default route) unless the
    # page holds a camera/microphone grant it remembers; the namespace has no default route, so
    # give it one over loopback (nothing leaves the namespace: lo is its only interface).
    route = await asyncio.create_subprocess_exec(
        "ip", "route", "replace", "default", "dev", "lo", "src", HOST
    )
    if await route.wait() != 0:
        raise RuntimeError("could not add a loopback default route in the test namespace")
    prefs = "".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n" for k, v in PREFS.items())
    (profile / "user.js").write_text(prefs)
    proc = await asyncio.create_subprocess_exec(
        FIREFOX,
        "--headless",
        "--no-remote",
        "--profile",
        str(profile),
        "--remote-debugging-port",
        "0",
        "--window-size",
        "1200,800",
        "about:blank",
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
    )
    assert proc.stderr is not None
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        if not line:
            raise RuntimeError("firefox exited before it opened its remote port")
        found = re.search(r"WebDriver BiDi listening on (ws://\S+)", line)
        if found:
            # Keep reading its log, or a full pipe would block Firefox.
            asyncio.get_running_loop().create_task(drain(proc.stderr))
            return proc, found.group(1).rstrip("/") + "/session"


async def drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline)
    with tempfile.TemporaryDirectory() as tmp:
        proc, bidi_url = await launch(Path(tmp))
        try:
            async with websockets.connect(bidi_url, max_size=None) as ws:
                b = Bidi(ws)
                await b.call("session.new", capabilities={})
                tree = await b.call("browsingContext.getTree")
                ctx = tree["contexts"][0]["context"]
                await b.call(
                    "browsingContext.navigate", context=ctx, url=page_url(url), wait="complete"
                )
                title = await b.js(ctx, "document.title")
                await b.js(ctx, "document.getElementById('call').click()")
                status = ""
                for _ in range(200):
                    status = await b.js(ctx, "document.getElementById('status').textContent")
                    if status == "Live":
                        break
                    await asyncio.sleep(0.1)
                await b.js(ctx, "document.getElementById('say').value = 'Hello from Firefox.'")
                await b.js(ctx, "document.getElementById('say-btn').click()")
                await asyncio.sleep(args.seconds)
                log = await b.js(ctx, "document.getElementById('log').innerText")
                if status != "Live":
                    raise RuntimeError(f"the call did not start: status {status!r}, log {log!r}")
                stats = await b.js(ctx, f"({PAGE_STATS_JS})()")
                overlay_fps = await b.js(ctx, "document.getElementById('s-fps').textContent")
                shot = await b.call("browsingContext.captureScreenshot", context=ctx)
                Path(args.screenshot).write_bytes(base64.b64decode(shot["data"]))
                await b.js(ctx, "document.getElementById('call').click()")  # end the call
                await asyncio.sleep(1.0)
                with contextlib.suppress(Exception):
                    await b.call("session.end")
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    left = len(server.calls)
    await server.stop()
    emit(
        {
            "title": title,
            "status": status,
            "stats": stats,
            "overlay_fps": overlay_fps,
            "sessions_left": left,
        }
    )


asyncio.run(main())

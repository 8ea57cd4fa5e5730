"""Headless Chromium on an https server with an access token: the page asks for the token once
(a wrong one is refused and asked again), keeps it for the tab, and the call goes live over wss."""

from __future__ import annotations

import argparse
import asyncio
import tempfile

from playwright.async_api import async_playwright

from talkloop.rtc.security import AccessPolicy
from talkloop.rtc.server import AvatarServer
from talkloop.rtc.tls import self_signed, server_context

from common import HOST, chromium, hang_up, make_reference, open_page, tiny_live_pipeline
from support import emit

TOKEN = "a-long-enough-access-token"
STATUS = "document.getElementById('status').textContent"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = self_signed([HOST], tmp)
        server = AvatarServer(
            pipeline, make_reference(128, 128), "", access=AccessPolicy(token=TOKEN)
        )
        port = await server.start(HOST, 0, ssl_context=server_context(cert, key))
    page_url = f"https://{HOST}:{port}/"
    answers = ["wrong-token-but-long-enough", TOKEN]
    dialogs: list[str] = []
    statuses: list[str] = []

    async def on_dialog(dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.accept(answers[min(len(dialogs), len(answers)) - 1])

    async def wait_status(text: str) -> None:
        await page.wait_for_function(f"{STATUS} === {text!r}", timeout=20000)
        statuses.append(text)

    async with async_playwright() as p:
        browser = await chromium(p)
        page, console = await open_page(browser, 1200, 800, https=True)
        page.on("dialog", on_dialog)
        await page.goto(page_url)
        await page.click("#call")  # asks; the wrong token is refused
        await wait_status("Access token refused")
        await page.screenshot(path=args.screenshot.replace(".png", "-refused.png"))
        await page.click("#call")  # asks again; the right one
        await wait_status("Live")
        stored = await page.evaluate("sessionStorage.getItem('talkloop.access')")
        await page.click("#call")  # end
        await page.reload()
        await page.click("#call")  # same tab: not asked again
        await wait_status("Live")
        await asyncio.sleep(2.0)  # frames on screen
        await page.screenshot(path=args.screenshot)
        await hang_up(page, browser)
    left = len(server.calls)
    await server.stop()
    emit(
        {
            "dialogs": dialogs,
            "statuses": statuses,
            "stored": stored,
            "token": TOKEN,
            "sessions_left": left,
            "console": console[-20:],
        }
    )


asyncio.run(main())

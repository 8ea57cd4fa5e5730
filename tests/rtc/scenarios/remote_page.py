"""The "other machine" of remote.py: headless Chromium in its own network namespace opens
``--url`` (https, self-signed), gives the access token when the page asks, and makes a call."""

from __future__ import annotations

import argparse
import asyncio

from playwright.async_api import async_playwright

from common import PAGE_PAIR_JS, PAGE_STATS_JS, chromium, hang_up, open_page, wait_live
from support import emit


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    dialogs: list[str] = []

    async def on_dialog(dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.accept(args.token)

    async with async_playwright() as p:
        browser = await chromium(p)
        # The certificate is self-signed for the server's address.
        page, console = await open_page(browser, 1000, 700, https=True)
        page.on("dialog", on_dialog)
        await page.goto(args.url)
        secure = await page.evaluate("window.isSecureContext")
        await page.click("#call")
        await wait_live(page, timeout_ms=30000)
        await asyncio.sleep(args.seconds)
        stats = await page.evaluate(PAGE_STATS_JS)
        pair = await page.evaluate(PAGE_PAIR_JS)
        await page.screenshot(path=args.screenshot)
        await hang_up(page, browser)
    emit(
        {
            "stats": stats,
            "pair": pair,
            "dialogs": dialogs,
            "secure": secure,
            "console": console[-20:],
        }
    )


asyncio.run(main())

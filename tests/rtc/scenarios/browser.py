"""Headless Chromium (Debian package, driven by Playwright) opens the page and makes a call."""

from __future__ import annotations

import argparse
import asyncio

from playwright.async_api import async_playwright

from common import (
    PAGE_STATS_JS,
    chromium,
    hang_up,
    open_page,
    page_url,
    start_server,
    tiny_live_pipeline,
    wait_live,
)
from support import emit


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline, notice="No trained weights are installed (test).")
    async with async_playwright() as p:
        browser = await chromium(p)
        page, console = await open_page(browser, 1200, 800)
        await page.goto(page_url(url))
        title = await page.title()
        await page.click("#call")
        await wait_live(page)
        await page.fill("#say", "Hello from the browser test.")
        await page.click("#say-btn")
        await asyncio.sleep(args.seconds)
        stats = await page.evaluate(PAGE_STATS_JS)
        overlay_fps = await page.text_content("#s-fps")
        notice = await page.text_content("#notice")
        agent_url = await page.text_content("#agent-url")
        await page.screenshot(path=args.screenshot)
        await hang_up(page, browser)  # end the call from the page
    left = len(server.calls)
    await server.stop()
    emit(
        {
            "title": title,
            "stats": stats,
            "overlay_fps": overlay_fps,
            "notice": notice,
            "agent_url": agent_url,
            "sessions_left": left,
            "console": console[-20:],
        }
    )


asyncio.run(main())

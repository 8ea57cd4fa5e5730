"""Headless Chromium (Debian package, driven by Playwright) opens the page and makes a call."""

from __future__ import annotations

import argparse
import asyncio

from playwright.async_api import async_playwright

from talkloop.pipeline.assets import HELLO_WAV

from common import PAGE_STATS_JS, emit, start_server, tiny_live_pipeline

CHROMIUM = "/usr/bin/chromium"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    server, url = await start_server(pipeline, notice="No trained weights are installed (test).")
    page_url = url.replace("ws://", "http://").removesuffix("/ws") + "/"
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--allow-loopback-in-peer-connection",
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                f"--use-file-for-fake-audio-capture={HELLO_WAV}",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        page = await browser.new_page(viewport={"width": 1200, "height": 800})
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        await page.goto(page_url)
        title = await page.title()
        await page.click("#call")
        await page.wait_for_function(
            "document.getElementById('status').textContent === 'Live'", timeout=20000
        )
        await page.fill("#say", "Hello from the browser test.")
        await page.click("#say-btn")
        await asyncio.sleep(args.seconds)
        stats = await page.evaluate(PAGE_STATS_JS)
        overlay_fps = await page.text_content("#s-fps")
        notice = await page.text_content("#notice")
        agent_url = await page.text_content("#agent-url")
        await page.screenshot(path=args.screenshot)
        await page.click("#call")  # end the call from the page
        await asyncio.sleep(1.0)
        await browser.close()
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

"""Headless Chromium picks a photo in the page and calls the portrait avatar made from it."""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
from playwright.async_api import async_playwright

from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models.registry import build_pipeline, load_reference

from common import (
    PAGE_STATS_JS,
    chromium,
    hang_up,
    open_page,
    page_url,
    start_server,
    wait_live,
)
from support import emit, live_config


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--photo", required=True)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    config = live_config(
        build_config(video={"width": args.size, "height": args.size}, model={"family": "portrait"})
    )
    pipeline = await asyncio.to_thread(build_pipeline, config)
    server, url = await start_server(pipeline)
    server.reference = load_reference(config, None)  # the server's own avatar: the default
    opened = []
    server.on_call = opened.append
    async with async_playwright() as p:
        browser = await chromium(p)
        page, console = await open_page(browser, 1200, 800)
        await page.goto(page_url(url))
        await page.set_input_files("#avatar-file", args.photo)
        await page.wait_for_function("!document.getElementById('avatar-pick').hidden")
        await page.click("#call")
        await wait_live(page, timeout_ms=60000)
        await page.fill("#say", "Hello, I am the person in your photo.")
        await page.click("#say-btn")
        await asyncio.sleep(args.seconds)
        stats = await page.evaluate(PAGE_STATS_JS)
        await page.screenshot(path=args.screenshot)
        used = opened[0].session.state.fields["renderer"].image.astype(np.int16)  # the call's photo
        await hang_up(page, browser)
    # The call's photo: the page's upload framed by the server, not the server's own avatar.
    framed_upload = load_reference(config, args.photo).astype(np.int16)
    own = server.reference.astype(np.int16)
    await server.stop()
    emit(
        {
            "stats": stats,
            "diff_to_upload": float(np.abs(used - framed_upload).mean()),
            "diff_to_default": float(np.abs(used - own).mean()),
            "console": console[-20:],
        }
    )


asyncio.run(main())

"""Headless Chromium calls through a real coturn, relay only: either the page asks for it
(``?relay=1``) or the server does for every call (``--ice-relay-only``: both peers relay)."""

from __future__ import annotations

import argparse
import asyncio

from playwright.async_api import async_playwright

from talkloop.rtc.ice import IceConfig

from common import (
    PAGE_PAIR_JS,
    PAGE_STATS_JS,
    chromium,
    hang_up,
    open_page,
    page_url,
    start_server,
    tiny_live_pipeline,
    wait_live,
)
from coturn import PASSWORD, USER, coturn
from support import emit


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--relay", choices=["page", "server"], required=True)
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    with coturn() as turn:
        ice = IceConfig([turn.url], USER, PASSWORD, relay_only=args.relay == "server")
        server, url = await start_server(pipeline, ice=ice)
        async with async_playwright() as p:
            browser = await chromium(p)
            page, console = await open_page(browser, 1000, 700)
            await page.goto(page_url(url) + ("?relay=1" if args.relay == "page" else ""))
            await page.click("#call")
            await wait_live(page)
            await asyncio.sleep(args.seconds)
            stats = await page.evaluate(PAGE_STATS_JS)
            pair = await page.evaluate(PAGE_PAIR_JS)
            await page.screenshot(path=args.screenshot)
            await hang_up(page, browser)
        left = len(server.calls)
        await server.stop()
        turn.wait_for_usage()
    # read after coturn has stopped: a UDP allocation aiortc leaves open is counted at exit
    allocations, peers, relayed = turn.allocations(), turn.relayed_peers(), turn.peer_bytes()
    emit(
        {
            "stats": stats,
            "pair": pair,
            "allocations": allocations,
            "relayed_peers": peers,
            "relayed_bytes": relayed,
            "sessions_left": left,
            "console": console[-20:],
        }
    )


asyncio.run(main())

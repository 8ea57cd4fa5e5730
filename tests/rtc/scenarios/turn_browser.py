"""Headless Chromium calls through a real coturn, relay only: either the page asks for it
(``?relay=1``) or the server does for every call (``--ice-relay-only``: both peers relay)."""

from __future__ import annotations

import argparse
import asyncio

from playwright.async_api import async_playwright

from talkloop.pipeline.assets import HELLO_WAV
from talkloop.rtc.ice import IceConfig

from common import PAGE_STATS_JS, emit, start_server, tiny_live_pipeline
from coturn import PASSWORD, USER, coturn

CHROMIUM = "/usr/bin/chromium"

# The page's selected candidate pair and the types of both its candidates.
PAIR_JS = """async () => {
    const report = await window.talkloop.stats();
    let pairId = null;
    report.forEach((r) => { if (r.type === 'transport' && r.selectedCandidatePairId) pairId = r.selectedCandidatePairId; });
    const pair = pairId && report.get(pairId);
    if (!pair) return null;
    const local = report.get(pair.localCandidateId), remote = report.get(pair.remoteCandidateId);
    return {local: local.candidateType, remote: remote.candidateType, relayProtocol: local.relayProtocol || null,
            localAddress: local.address, remoteAddress: remote.address};
}"""


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
        page_url = url.replace("ws://", "http://").removesuffix("/ws") + "/"
        if args.relay == "page":
            page_url += "?relay=1"
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
            page = await browser.new_page(viewport={"width": 1000, "height": 700})
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            await page.goto(page_url)
            await page.click("#call")
            await page.wait_for_function(
                "document.getElementById('status').textContent === 'Live'", timeout=20000
            )
            await asyncio.sleep(args.seconds)
            stats = await page.evaluate(PAGE_STATS_JS)
            pair = await page.evaluate(PAIR_JS)
            await page.screenshot(path=args.screenshot)
            await page.click("#call")
            await asyncio.sleep(1.0)
            await browser.close()
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

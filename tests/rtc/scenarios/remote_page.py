"""The "other machine" of remote.py: headless Chromium in its own network namespace opens
``--url`` (https, self-signed), gives the access token when the page asks, and makes a call."""

from __future__ import annotations

import argparse
import asyncio

from playwright.async_api import async_playwright

from talkloop.pipeline.assets import HELLO_WAV

from common import PAGE_STATS_JS, emit

CHROMIUM = "/usr/bin/chromium"

# The selected candidate pair's addresses (which interface the call really used).
PAIR_JS = """async () => {
    const report = await window.talkloop.stats();
    let pairId = null;
    report.forEach((r) => { if (r.type === 'transport' && r.selectedCandidatePairId) pairId = r.selectedCandidatePairId; });
    const pair = pairId && report.get(pairId);
    if (!pair) return null;
    const local = report.get(pair.localCandidateId), remote = report.get(pair.remoteCandidateId);
    return {local: local.address, remote: remote.address, localType: local.candidateType};
}"""


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
        # The certificate is self-signed for the server's address: accept it as a user would
        # after the browser's warning.
        context = await browser.new_context(
            ignore_https_errors=True, viewport={"width": 1000, "height": 700}
        )
        page = await context.new_page()
        page.on("dialog", on_dialog)
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        await page.goto(args.url)
        secure = await page.evaluate("window.isSecureContext")
        await page.click("#call")
        await page.wait_for_function(
            "document.getElementById('status').textContent === 'Live'", timeout=30000
        )
        await asyncio.sleep(args.seconds)
        stats = await page.evaluate(PAGE_STATS_JS)
        pair = await page.evaluate(PAIR_JS)
        await page.screenshot(path=args.screenshot)
        await page.click("#call")
        await asyncio.sleep(1.0)
        await browser.close()
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

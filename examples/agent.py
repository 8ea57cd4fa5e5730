"""A voice agent in another process: speaks lines through a running talkloop session.

Open the page (or any viewer) first; it shows the agent URL of its call. Then, with that URL as
it is (quoted: it holds a ``&``):

    python examples/agent.py --url "ws://127.0.0.1:8080/ws?token=<token>&role=agent" "Hello." "How are you?"

or with the token on its own: ``--url ws://127.0.0.1:8080/ws --token <token>``.

A server started with ``--access-token`` needs it here too: ``--access-token TOKEN`` (or the
``TALKLOOP_ACCESS_TOKEN`` environment variable, which keeps it out of the shell history). Over
``wss://`` with a self-signed certificate (``talkloop serve --tls-self-signed``), pass that
certificate with ``--tls-ca FILE`` (the server prints its path).

Each line is synthesised with the built-in TTS (espeak-ng), streamed as binary PCM16 while it is
being made, and closed with segment_end. With --interrupt-after S the agent interrupts the last
line S seconds after it started playing (as it would when the user barges in). Playback events
are printed as JSON lines, e.g. ``{"type": "playback_finished", "position_ms": 1480, ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import websockets

# Run as a script, this file's folder comes first on sys.path, and the file, being named like
# the package it uses, would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from talkloop.agent.tts import EspeakTTS, TTSOptions  # noqa: E402


def agent_url(url: str, token: str | None, access: str | None = None) -> str:
    """The URL an agent connects to: ``url`` with ``token`` (from ``--token`` or from the URL's
    own query, as the page shows it), ``role=agent`` and, if given, the server's ``access`` token.

    Raises:
        ValueError: no token, two different tokens, or not a ws:// or wss:// URL.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"--url must be a ws:// or wss:// URL, got {url!r}")
    query = parse_qs(parts.query)
    in_url = query.get("token", [None])[0]
    if in_url and token and in_url != token:
        raise ValueError(
            f"--token {token!r} differs from the token in --url ({in_url!r}): give one"
        )
    token = token or in_url
    if not token:
        raise ValueError(
            "no session token: pass the agent URL the page shows, "
            '--url "ws://HOST:PORT/ws?token=...&role=agent", or --token TOKEN'
        )
    query.update(token=[token], role=["agent"])
    if access:
        query["access"] = [access]
    return urlunsplit(parts._replace(query=urlencode(query, doseq=True)))


async def run(
    url: str,
    lines: list[str],
    interrupt_after: float | None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    tts = EspeakTTS(TTSOptions())
    tls = {"ssl": ssl_context} if ssl_context is not None else {}
    async with websockets.connect(url, max_size=2**20, **tls) as ws:
        hello = json.loads(await ws.recv())
        if hello["type"] != "agent":
            raise SystemExit(f"not accepted: {hello.get('code')}: {hello.get('message', hello)}")
        await ws.send(json.dumps({"type": "audio_format", "sample_rate": tts.sample_rate}))
        finished: asyncio.Queue[dict] = asyncio.Queue()
        started: asyncio.Queue[dict] = asyncio.Queue()

        async def events() -> None:
            async for raw in ws:
                msg = json.loads(raw)
                print(json.dumps(msg), flush=True)
                if msg["type"] == "playback_finished":
                    finished.put_nowait(msg)
                elif msg["type"] == "playback_started":
                    started.put_nowait(msg)

        async def next_event(queue: asyncio.Queue[dict]) -> dict:
            """The next event of ``queue``; exits if the session ends first (no more will come)."""
            if not queue.empty():
                return queue.get_nowait()
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, reader}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                raise SystemExit(
                    "the session ended (its call was closed) before the agent was done"
                )
            return get.result()

        reader = asyncio.create_task(events())
        for i, line in enumerate(lines):
            while not started.empty():  # only this line's playback_started counts below
                started.get_nowait()
            async for frame in tts.stream(line):  # send while espeak is still synthesising
                await ws.send(frame.data)
            await ws.send(json.dumps({"type": "segment_end"}))
            if interrupt_after is not None and i == len(lines) - 1:
                await next_event(started)
                await asyncio.sleep(interrupt_after)
                await ws.send(json.dumps({"type": "interrupt"}))
            await next_event(finished)  # one segment at a time, like a turn-taking agent
        await ws.send(json.dumps({"type": "bye"}))
        reader.cancel()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; ``args.url`` is the URL to connect to (token and role included)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--url",
        default="ws://127.0.0.1:8080/ws",
        help="the agent URL the page shows (quote it), or the server's /ws URL with --token",
    )
    ap.add_argument("--token", help="the session token, if --url does not carry it")
    ap.add_argument(
        "--access-token",
        default=os.environ.get("TALKLOOP_ACCESS_TOKEN"),
        help="the server's access token, if it has one (default: $TALKLOOP_ACCESS_TOKEN)",
    )
    ap.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="trust this certificate (PEM) for wss://, e.g. the server's --tls-self-signed one",
    )
    ap.add_argument("--interrupt-after", type=float, default=None, metavar="S")
    ap.add_argument("lines", nargs="*", default=["Hello, I am your avatar.", "Nice to meet you."])
    args = ap.parse_args(argv)
    try:
        args.url = agent_url(args.url, args.token, args.access_token)
    except ValueError as err:
        ap.error(str(err))
    args.ssl_context = None
    if args.tls_ca:
        if not args.url.startswith("wss://"):
            ap.error("--tls-ca is for wss:// URLs")
        try:
            args.ssl_context = ssl.create_default_context(cafile=args.tls_ca)
        except (OSError, ssl.SSLError) as err:
            ap.error(f"--tls-ca: cannot use {args.tls_ca}: {getattr(err, 'strerror', None) or err}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    asyncio.run(run(args.url, args.lines, args.interrupt_after, args.ssl_context))


if __name__ == "__main__":
    main()

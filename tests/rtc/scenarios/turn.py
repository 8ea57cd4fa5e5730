"""A call relayed by a real coturn: a relay-only aiortc client (it has no other candidate) calls
a server that names the TURN server; coturn's log shows what it relayed."""

from __future__ import annotations

import argparse
import asyncio

from aiortc import RTCConfiguration, RTCIceServer
from aiortc.rtcconfiguration import RTCIceTransportPolicy

from talkloop.rtc.client import run_call
from talkloop.rtc.ice import IceConfig

from common import HOST, start_server, tiny_live_pipeline
from coturn import PASSWORD, USER, coturn
from support import emit


def selected_pair(pc) -> tuple[str, str] | None:
    """(local, remote) candidate types of the pair aioice nominated (aiortc's stats lack it)."""
    for t in pc.getTransceivers():
        conn = t.receiver.transport.transport.iceGatherer._connection
        for pair in conn._nominated.values():
            return pair.local_candidate.type, pair.remote_candidate.type
    return None


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--transport", default="udp", choices=["udp", "tcp"])
    args = ap.parse_args()
    pipeline = tiny_live_pipeline(128)
    with coturn(args.transport) as turn:
        ice = IceConfig([turn.url], USER, PASSWORD)
        server, url = await start_server(pipeline, ice=ice)
        seen = {}

        import talkloop.rtc.client

        real = talkloop.rtc.client.RTCPeerConnection

        def recording(configuration=None):  # keep the client's peer to read its nominated pair
            pc = real(configuration)
            seen["pc"] = pc

            @pc.on("connectionstatechange")
            def on_state() -> None:
                if pc.connectionState == "connected":
                    seen["pair"] = selected_pair(pc)

            return pc

        talkloop.rtc.client.RTCPeerConnection = recording
        client = RTCConfiguration(
            iceServers=[RTCIceServer(turn.url, USER, PASSWORD)],
            iceTransportPolicy=RTCIceTransportPolicy.RELAY,
        )
        r = await run_call(url, args.seconds, configuration=client)
        await server.stop()
        turn.wait_for_usage()
    # read after coturn has stopped: a UDP allocation aiortc leaves open is counted at exit
    allocations, peers, relayed = turn.allocations(), turn.relayed_peers(), turn.peer_bytes()
    emit(
        {
            **r.summary(),
            "video_pts": r.video_pts,
            "session_ice": r.session.get("ice"),
            "pair": seen.get("pair"),
            "allocations": allocations,
            "relayed_peers": peers,
            "relayed_bytes": relayed,
            "server_host": HOST,
            "sessions_left": len(server.calls),
        }
    )


asyncio.run(main())

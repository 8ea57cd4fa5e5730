"""The agent endpoint: a voice agent joins a running call with ``/ws?token=<token>&role=agent``.

The token is the call's (the page got it in its hello; the wire calls it the session token).
One agent drives a call at a time; it speaks the agent protocol (``talkloop/agent/protocol.py``,
``docs/agents.md``): its speech drives the avatar the viewer sees, and it hears the call's
playback events. A connected agent keeps a call without an offer open (docs/agents.md); when it
leaves the call goes on, and the offer timer runs again if the page has not called yet.

The refusals (an unknown token, a connection that is not an agent, a second agent) are the same
on a cluster's front, which relays agents to the worker that runs their call.
"""

from __future__ import annotations

import contextlib
import json
import logging

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from talkloop.agent.frames import PlaybackEvent
from talkloop.agent.protocol import AgentChannel, event_message
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.rtc.admission import Query
from talkloop.rtc.protocol import error, guarded
from talkloop.rtc.slots import CallSlot, SlotPool

log = logging.getLogger("talkloop.server")

__all__ = ["AgentEndpoint", "refuse_second_agent", "refuse_unknown_token", "refuse_unless_agent"]


async def refuse_unknown_token(ws: ServerConnection) -> None:
    """No open call has the token the connection came with: say so and close."""
    await ws.send(
        error("bad_token", "unknown call token: the call may have ended; start a new one")
    )
    await ws.close(4401, "unknown call token")


async def refuse_unless_agent(ws: ServerConnection, query: Query) -> bool:
    """Only an agent (``role=agent``) may join a running call by its token: anything else is
    told so and closed. True when it was refused."""
    if query.get("role", [""])[0] == "agent":
        return False
    await ws.send(
        error("not_supported", "joining a running call is only supported for agents (role=agent)")
    )
    await ws.close(4400, "not supported")
    return True


async def refuse_second_agent(ws: ServerConnection) -> None:
    await ws.send(error("bad_state", "this call already has an agent connected"))
    await ws.close(4409, "agent already connected")


class AgentEndpoint:
    """Serves agents' websockets for the calls of ``pool``.

    Args:
        pool: the server's open calls, by token.
        pipeline: the calls' pipeline (the agent's hello gives its rates and video).
    """

    def __init__(self, pool: SlotPool, pipeline: Pipeline) -> None:
        self.pool = pool
        self.pipeline = pipeline

    async def serve(self, ws: ServerConnection, query: Query) -> None:
        """One agent connection (``query`` has its token), until it or its call ends."""
        slot = self.pool.calls.get(query["token"][0])
        if slot is None:
            await refuse_unknown_token(ws)
            return
        if await refuse_unless_agent(ws, query):
            return
        await self._drive(slot, ws)

    async def _drive(self, slot: CallSlot, ws: ServerConnection) -> None:
        """One agent connection driving ``slot``'s call (talkloop/agent/protocol.py)."""
        if slot.agent is not None:
            await refuse_second_agent(ws)
            return
        avatar = slot.call.avatar
        slot.agent = ws

        def hear(event: PlaybackEvent) -> None:  # the call's playback events, in the protocol
            slot.send_soon(event_message(event), ws)

        avatar.listeners.append(hear)
        self.pool.disarm_offer_timer(slot)  # a connected agent is activity: see docs/agents.md
        channel = AgentChannel(avatar)
        info = self.pipeline.info
        log.info("call %s: agent connected", slot.name)
        try:
            await ws.send(
                json.dumps(
                    {
                        "type": "agent",
                        "token": slot.token,
                        "sample_rate": info.sample_rate,
                        "output_sample_rate": avatar.sample_rate,
                        "video": {"width": info.width, "height": info.height, "fps": info.fps},
                    }
                )
            )
            async for raw in ws:
                reply = await guarded(self._message(channel, raw), slot.name)
                if reply is not None:
                    await ws.send(reply)
                if channel.closed or slot.closed:
                    break
        except ConnectionClosed:
            pass
        finally:
            if slot.agent is ws:
                with contextlib.suppress(ValueError):  # gone already if the call closed
                    avatar.listeners.remove(hear)
                slot.agent = None
                if not slot.closed:
                    with contextlib.suppress(Exception):
                        channel.detach()
                    if slot.call.peer is None:
                        self.pool.arm_offer_timer(slot)
            with contextlib.suppress(Exception):
                await ws.close()
            log.info("call %s: agent left", slot.name)

    @staticmethod
    async def _message(channel: AgentChannel, raw: str | bytes) -> None:
        channel.handle(raw)

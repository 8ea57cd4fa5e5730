"""RelaySocket: the far end of a page's or agent's websocket, inside the Ray actor of a call.

On a cluster the websocket ends at the front process (`talkloop/rtc/cluster.py`) and the call runs in an
actor on a worker node (`talkloop/rtc/call_host.py`). The actor runs the same ``AvatarServer`` code as a
single process does, on a RelaySocket instead of a websocket: what the front receives is fed in
(``feed``, ``end``), what the server sends or closes goes to the actor's outbox, which the front
polls and forwards. It keeps the websocket calls the server uses: ``send``, ``recv``, ``close``
and ``async for``; a send after close raises ``ConnectionClosed`` as a websocket would.
"""

from __future__ import annotations

import asyncio

from websockets.exceptions import ConnectionClosed

_END = None  # the front's websocket closed


class RelaySocket:
    """One relayed connection.

    Args:
        channel: the name its messages carry in the outbox ("page", or "agent<n>").
        outbox: the actor's queue of ``(channel, kind, payload)`` for the front: kind "msg"
            (payload the message, str or bytes) or "close" (payload ``[code, reason]``).
    """

    def __init__(self, channel: str, outbox: asyncio.Queue) -> None:
        self.channel = channel
        self.outbox = outbox
        self.closed = False
        self._inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()

    # -- the front's side ------------------------------------------------------------------------

    def feed(self, raw: str | bytes) -> None:
        """A message the front received on the real websocket."""
        if not self.closed:
            self._inbox.put_nowait(raw)

    def end(self) -> None:
        """The real websocket closed: the server's receive loop ends."""
        self.closed = True
        self._inbox.put_nowait(_END)

    # -- the server's side (the websocket calls AvatarServer makes) ------------------------------

    async def send(self, message: str | bytes) -> None:
        if self.closed:
            raise ConnectionClosed(None, None)
        self.outbox.put_nowait((self.channel, "msg", message))

    async def recv(self) -> str | bytes:
        raw = await self._inbox.get()
        if raw is _END:
            self._inbox.put_nowait(_END)  # every later reader sees the end too
            raise ConnectionClosed(None, None)
        return raw

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if not self.closed:
            self.outbox.put_nowait((self.channel, "close", [code, reason]))
            self.end()

    def __aiter__(self) -> RelaySocket:
        return self

    async def __anext__(self) -> str | bytes:
        try:
            return await self.recv()
        except ConnectionClosed:
            raise StopAsyncIteration from None

"""Page signaling: the page's websocket (``/ws``), from opening its call to hanging up.

A page that is admitted gets a slot (else ``busy``), may send its own photo first
(``/ws?avatar=1``, ``talkloop/rtc/avatar.py``), and its call is opened on the server's control
pool. The page gets the call's hello (``session``: the token an agent joins with, the video,
the ICE servers), then the call's stats once a second and its ``speech`` events. Its messages
(``talkloop/rtc/protocol.py``): the offer, answered by our ``Peer`` (``talkloop/rtc/peer.py``),
trickled ICE candidates, ``say``, ``prompt``, ``interrupt`` and ``bye``. A bad message is
answered with an error and the call goes on; when the page leaves, its call is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from talkloop.agent.frames import PlaybackEvent, PlaybackStarted
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.rtc.admission import Query
from talkloop.rtc.avatar import AVATAR_WAIT_S, decode_avatar
from talkloop.rtc.call import Call
from talkloop.rtc.ice import IceConfig
from talkloop.rtc.peer import Peer
from talkloop.rtc.protocol import HELLO, ProtocolError, error, error_code, guarded, parse_message
from talkloop.rtc.slots import CallSlot, SlotPool

log = logging.getLogger("talkloop.server")

STATS_INTERVAL_S = 1.0

__all__ = ["STATS_INTERVAL_S", "PageSignaling"]


class PageSignaling:
    """Serves pages' websockets: each opens one call in ``pool``.

    Args:
        pool: the server's call slots.
        pipeline: the calls' pipeline (its video for the hello, its config for a page's photo).
        open_call: opens the Call of slot ``number`` on a page's own photo (None: the
            server's avatar).
        prompt: the initial style prompt of each call (told to the page).
        notice: a line shown on the page (e.g. that no trained weights are installed).
        ice: the STUN/TURN servers of every call, for our peer and (in the hello) the page.
        executor: the server's control pool (a page's photo is decoded there).
        on_open: told of each call once it is open, before the page hears of it.
    """

    def __init__(
        self,
        pool: SlotPool,
        pipeline: Pipeline,
        open_call: Callable[[np.ndarray | None, int], Awaitable[Call]],
        *,
        prompt: str,
        notice: str,
        ice: IceConfig,
        executor: Executor,
        on_open: Callable[[Call], None] = lambda call: None,
    ) -> None:
        self.pool = pool
        self.pipeline = pipeline
        self.open_call = open_call
        self.prompt = prompt
        self.notice = notice
        self.ice = ice
        self.executor = executor
        self.on_open = on_open

    async def serve(self, ws: ServerConnection, query: Query) -> None:
        """One page's connection: opens its call, acts on its messages, closes the call when
        the page leaves."""
        number = self.pool.reserve()
        if number is None:
            await ws.send(self.pool.busy_message())
            await ws.close(1013, "busy")
            return
        loop = asyncio.get_running_loop()
        try:
            reference = None
            if query.get("avatar", [""])[0] == "1":  # the page sends its own photo first
                reference = await self._read_avatar(ws)
            call = await self.open_call(reference, number)
        except ConnectionClosed:
            return
        except ProtocolError as err:  # a bad photo ends this connection only
            with contextlib.suppress(ConnectionClosed):
                await ws.send(error(err.code, str(err)))
                await ws.close(4400, err.code)
            return
        except Exception as err:
            log.exception("could not open a call")
            await ws.send(error("internal", f"could not open a call: {err}"))
            await ws.close(1011, "call failed")
            return
        finally:
            self.pool.unreserve(number)
        slot = CallSlot(call, ws, number)
        self.pool.add(slot)
        call.avatar.listeners.append(lambda event: self._on_playback(slot, event))
        self.on_open(call)
        try:
            await ws.send(json.dumps(self._hello(call)))
            slot.tasks.append(loop.create_task(self._stats(slot)))
            async for raw in ws:
                reply = await guarded(self._on_message(slot, raw), slot.name)
                if reply is not None:
                    await ws.send(reply)
                if slot.closed:
                    break
        except ConnectionClosed:
            pass
        finally:
            await self.pool.close(slot)

    def _hello(self, call: Call) -> dict:
        info = self.pipeline.info
        return {
            "type": HELLO,
            "token": call.token,
            "notice": self.notice,
            "video": {"width": info.width, "height": info.height, "fps": info.fps},
            "prompt": self.prompt,
            "ice": self.ice.for_page(),
        }

    async def _read_avatar(self, ws: ServerConnection) -> np.ndarray:
        """The photo a page announced with ``?avatar=1``, as the call's reference."""
        try:
            raw = await asyncio.wait_for(ws.recv(), AVATAR_WAIT_S)
        except TimeoutError:
            raise ProtocolError(
                "bad_avatar", f"no avatar photo arrived within {AVATAR_WAIT_S:g} s"
            ) from None
        msg = parse_message(raw)
        if msg["type"] != "avatar":
            raise ProtocolError(
                "bad_avatar",
                f"expected the avatar photo first (connected with ?avatar=1), got {msg['type']!r}",
            )
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, decode_avatar, msg.get("image"), self.pipeline.config
        )

    async def _on_message(self, slot: CallSlot, raw: str | bytes) -> None:
        msg = parse_message(raw)
        kind = msg["type"]
        call = slot.call
        if kind == "offer":
            if call.peer is not None:
                raise ProtocolError(
                    "bad_state", "this call has had its offer (one per call); start a new call"
                )
            peer = Peer(
                call.audio_track,
                call.video_track,
                on_microphone=call.attach_microphone,
                on_closed=lambda: self.pool.close(slot),
                configuration=self.ice.rtc_configuration(),
                name=slot.name,
            )
            call.peer = peer
            self.pool.disarm_offer_timer(slot)
            try:
                sdp = await peer.answer(msg["sdp"])
            except ProtocolError:
                call.peer = None
                await peer.close()
                self.pool.arm_offer_timer(slot)
                raise
            await slot.ws.send(json.dumps({"type": "answer", "sdp": sdp}))
            call.start()
        elif kind == "candidate":
            if call.peer is None:
                raise ProtocolError("bad_state", "send the offer before ICE candidates")
            await call.peer.add_candidate(
                msg.get("candidate"), msg.get("sdpMid"), msg.get("sdpMLineIndex")
            )
        elif kind == "say":
            task = call.say(msg["text"])
            task.add_done_callback(lambda t: self._say_done(slot, t))
        elif kind == "prompt":
            call.set_prompt(msg["text"])
        elif kind == "interrupt":
            call.interrupt()
        elif kind == "bye":
            slot.closed = True
        elif kind == "avatar":
            raise ProtocolError(
                "bad_state", "the avatar photo goes first, on a connection to /ws?avatar=1"
            )

    def _on_playback(self, slot: CallSlot, event: PlaybackEvent) -> None:
        """Playback events go to the page as ``speech`` (to the agent: ``AgentEndpoint``)."""
        if isinstance(event, PlaybackStarted):
            state = "started"
        else:
            state = "interrupted" if event.interrupted else "finished"
        slot.send_soon({"type": "speech", "state": state})

    def _say_done(self, slot: CallSlot, task: asyncio.Task) -> None:
        if task.cancelled() or slot.closed:
            return
        err = task.exception()
        if err is not None:
            slot.send_soon(json.loads(error(error_code(err), f"say failed: {err}")))

    async def _stats(self, slot: CallSlot) -> None:
        last_sent, last_t = 0, time.monotonic()
        while not slot.closed:
            await asyncio.sleep(STATS_INTERVAL_S)
            stats = slot.call.stats()
            now = time.monotonic()
            stats["fps"] = round((stats["frames_sent"] - last_sent) / (now - last_t), 1)
            last_sent, last_t = stats["frames_sent"], now
            await slot.send({"type": "stats", **stats})

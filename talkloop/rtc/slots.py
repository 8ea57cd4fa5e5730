"""The slot pool: how many calls one server holds at once, and its record of each open call.

A server serves at most ``max_calls`` calls. Each open call holds a slot, numbered 1..max_calls
(the lowest free one; a per-call mirror stream is named by it), from the moment its page is
admitted until its call has closed: a call being opened holds its slot already, and a closed
call whose mirrors still upload holds it until they have drained, so a new call on that slot
cannot write into a stream the old one still uploads. Without a free slot a page gets ``busy``.

The pool also frees slots that nobody uses: a call whose page sends no offer within
``offer_timeout_s`` while no agent is connected gets ``offer_timeout`` and is closed (an idle
tab cannot hold a slot), and a call whose generation fails is ended alone, its page and agent
told ``generation_failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.core.heap import release_free_memory
from talkloop.rtc.call import Call
from talkloop.rtc.protocol import error

log = logging.getLogger("talkloop.server")

__all__ = ["CallSlot", "SlotPool", "call_token", "check_max_calls"]


def check_max_calls(config: TalkloopConfig, max_calls: int) -> None:
    """Refuse settings that cannot serve ``max_calls`` calls at once.

    An offloaded module streams its blocks through one ring of device slots (its
    BlockOffloader); two calls' generation threads would overwrite each other's blocks.
    """
    offloaded = [n for n, m in config.model.placement.model_dump().items() if m == "offloaded"]
    if offloaded and max_calls > 1:
        raise ConfigError(
            f"--placement {','.join(f'{n}=offloaded' for n in offloaded)} serves one call at a "
            f"time (the offloaded blocks share one ring of device slots), but --max-calls "
            f"(--max-sessions) is {max_calls}; use --max-calls 1 or resident placement"
        )


def call_token() -> str:
    """A new call's token (the wire's "session token"): 32 hex digits (128 random bits).

    Hex, not ``secrets.token_urlsafe``: a token that starts with ``-`` (as about one in 32 of
    those do) is read as an option when pasted after ``--token`` on a command line, and ``-``
    and ``_`` make a user wonder what needs quoting. Hex digits never need it, in a URL or a shell.
    """
    return secrets.token_hex(16)


@dataclass
class CallSlot:
    """The server's record of one open call: the Call and the connections that drive it.

    The Call (``talkloop/rtc/call.py``) is the media side (peer, avatar, mirrors); this adds what
    only the server knows: the page's and the agent's websockets, the slot number and the timer.
    """

    call: Call
    ws: ServerConnection  # the page's websocket
    number: int  # 1..max_calls, unique among open calls (names per-call mirrors)
    agent: ServerConnection | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)
    offer_timer: asyncio.TimerHandle | None = None  # armed while no peer and no agent
    closed: bool = False

    @property
    def token(self) -> str:
        return self.call.token

    @property
    def name(self) -> str:
        """The call's name in log lines: its token's first digits."""
        return self.call.token[:6]

    def send_soon(self, msg: dict[str, Any], ws: ServerConnection | None = None) -> None:
        """Send ``msg`` to the page (or to ``ws``) from a task of this call's, unless it closed."""
        if not self.closed:
            task = asyncio.get_running_loop().create_task(self.send(msg, ws))
            self.tasks.append(task)
            # Finished sends leave the list: a long call must not accumulate done tasks.
            task.add_done_callback(lambda t: t in self.tasks and self.tasks.remove(t))

    async def send(self, msg: dict[str, Any], ws: ServerConnection | None = None) -> None:
        """Send ``msg`` to the page (or to ``ws``); a connection that has gone is no error."""
        with contextlib.suppress(ConnectionClosed):
            await (ws or self.ws).send(json.dumps(msg))


class SlotPool:
    """The call slots of one server and its open calls (see the module's docstring).

    Args:
        max_calls: calls open at once at most.
        executor: the server's control pool (the blocking part of freeing a call runs there).
        offer_timeout_s: a call whose page sends no offer this long (while no agent is
            connected) is closed with ``offer_timeout``.
        drains: whether a call's mirrors may still be uploading when it closes (then its slot
            stays taken until its close has returned); asked as each call closes.
    """

    def __init__(
        self,
        max_calls: int,
        executor: Executor,
        offer_timeout_s: float,
        drains: Callable[[], bool] = lambda: False,
    ) -> None:
        self.max_calls = max_calls
        self.executor = executor
        self.offer_timeout_s = offer_timeout_s
        self.drains = drains
        self.calls: dict[str, CallSlot] = {}  # by token
        self.opening: set[int] = set()  # slots of calls being opened (count against the cap)
        self.draining: set[int] = set()  # slots of closed calls whose mirrors still upload
        self._ending: set[asyncio.Task] = set()  # calls being ended by the server

    # -- capacity --------------------------------------------------------------------------------

    def taken(self) -> set[int]:
        return self.opening | self.draining | {s.number for s in self.calls.values()}

    def reserve(self) -> int | None:
        """The lowest free slot, now held for a call being opened; None when the pool is full
        (``busy_message`` says so to the page)."""
        free = set(range(1, self.max_calls + 1)) - self.taken()
        if len(self.calls) + len(self.opening) >= self.max_calls or not free:
            return None
        number = min(free)
        self.opening.add(number)
        return number

    def unreserve(self, number: int) -> None:
        """The call of slot ``number`` is open (``add``) or could not be opened."""
        self.opening.discard(number)

    def busy_message(self) -> str:
        return error(
            "busy", f"the server is at its limit of {self.max_calls} call(s); try again later"
        )

    # -- open calls ------------------------------------------------------------------------------

    def add(self, slot: CallSlot) -> None:
        """Record a call just opened; its offer timer starts now."""
        self.calls[slot.token] = slot
        slot.call.avatar.failure_listeners.append(lambda err: self._on_failure(slot, err))
        self.arm_offer_timer(slot)
        log.info("call %s opened (%d active)", slot.name, len(self.calls))

    def arm_offer_timer(self, slot: CallSlot) -> None:
        """The call must get an offer (or an agent) within ``offer_timeout_s`` from now."""
        self.disarm_offer_timer(slot)
        if not slot.closed:
            slot.offer_timer = asyncio.get_running_loop().call_later(
                self.offer_timeout_s, self._offer_timed_out, slot
            )

    @staticmethod
    def disarm_offer_timer(slot: CallSlot) -> None:
        if slot.offer_timer is not None:
            slot.offer_timer.cancel()
            slot.offer_timer = None

    def _offer_timed_out(self, slot: CallSlot) -> None:
        slot.offer_timer = None
        if slot.closed or slot.call.peer is not None or slot.agent is not None:
            return
        log.info("call %s: no offer within %g s", slot.name, self.offer_timeout_s)
        msg = error(
            "offer_timeout",
            f"no offer within {self.offer_timeout_s:g} s: the call was closed to free its "
            "slot; start the call again",
        )
        self.end_soon(slot, msg, 4408, "no offer")

    def _on_failure(self, slot: CallSlot, err: BaseException) -> None:
        """Generation failed: tell the page and the agent, then end this call only."""
        msg = error(
            "generation_failed",
            f"the avatar stopped: generation failed ({err}); the call has ended, start a new one",
        )
        self.end_soon(slot, msg, 1011, "generation failed")

    def end_soon(self, slot: CallSlot, msg: str, code: int, reason: str) -> None:
        """Tell the page and the agent ``msg``, close the page's websocket with ``code`` and
        ``reason``, and close the call: from a task of the pool's own."""

        async def end() -> None:
            for ws in (slot.ws, slot.agent):
                if ws is not None:
                    with contextlib.suppress(ConnectionClosed):
                        await ws.send(msg)
            with contextlib.suppress(Exception):
                await slot.ws.close(code, reason)
            await self.close(slot)

        if not slot.closed:
            # Not in slot.tasks: close cancels those, and this task is the one calling it.
            task = asyncio.get_running_loop().create_task(end())
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    async def close(self, slot: CallSlot) -> None:
        """Close the call and free its slot (once its mirrors have drained). Idempotent."""
        if self.calls.get(slot.token) is not slot:
            return
        slot.closed = True
        del self.calls[slot.token]
        self.disarm_offer_timer(slot)
        if self.drains():
            self.draining.add(slot.number)
        for task in slot.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        try:
            await slot.call.close()
        finally:
            self.draining.discard(slot.number)
        for ws in (slot.ws, slot.agent):
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.close()
        log.info("call %s closed (%d active)", slot.name, len(self.calls))
        # what the call freed goes back to the system instead of staying in the allocator's pools
        await asyncio.get_running_loop().run_in_executor(self.executor, release_free_memory)

    async def close_all(self) -> None:
        """Close every call, and wait for those the pool was already ending."""
        for slot in list(self.calls.values()):
            await self.close(slot)
        for task in list(self._ending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

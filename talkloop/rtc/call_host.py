"""CallHost: one live call inside a Ray actor on a worker node (``talkloop serve --cluster``).

The actor holds one ``talkloop_slot`` of its node and owns the whole call: the pipeline, the
``Call`` (AvatarSession, aiortc peer, KVS mirrors) and a single process's server of one slot: its
page signaling (``talkloop/rtc/signaling.py``) and agent endpoint
(``talkloop/rtc/agent_endpoint.py``), run on ``RelaySocket``s instead of websockets; the front
did the admission. Its aiortc peer gathers the worker node's own ICE candidates, so media flows
between the browser and the worker; only signaling, controls, stats and the agent protocol pass
through the front (``talkloop/rtc/cluster.py``).

The front calls, in order: ``prepare`` (placed, networks loaded, the avatar prepared: a warm actor
waits here for a page), ``start`` (the page's connection served), then ``page_messages`` /
``agent_*`` as messages arrive (in order, in batches), while it long-polls ``poll`` for what the
call sends. ``poll`` answers at least every ``wait_s`` even when there is nothing to send, so a
front that hears nothing for longer knows the actor or its node is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.core.heap import freeze_loaded
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.rtc.call import CallConfig
from talkloop.rtc.ice import IceConfig
from talkloop.rtc.relay import RelaySocket
from talkloop.rtc.server import AvatarServer, prepare_avatar


@dataclass
class HostSpec:
    """What every call's actor needs; put in Ray's object store once by the front."""

    config: dict  # TalkloopConfig.model_dump(mode="json"), with the live schedule
    reference: np.ndarray  # (H, W, 3) uint8: the avatar of every call
    prompt: str
    call_config: CallConfig
    notice: str
    ice: IceConfig
    offer_timeout_s: float
    mirror_factory: Callable[[int], list] | None = None  # KVS mirrors of call number n


class CallHost:
    """The actor body (``ray.remote(CallHost)`` in ``talkloop/rtc/cluster.py``).

    Args:
        spec: the settings of every call.
    """

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.number = 0  # the call's number at the front (names its per-call KVS stream)
        self.server = None
        self.outbox: asyncio.Queue | None = None
        self.page: RelaySocket | None = None
        self.agents: dict[str, RelaySocket] = {}
        self._tasks: list[asyncio.Task] = []

    async def node(self) -> str:
        """The Ray node id this actor was placed on (answers as soon as it is placed)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def idle_on(self) -> str | None:
        """Its node id while it waits for a page (a warm actor), else None (``worker --drain``
        stops warm actors on the node it drains: they hold a slot but no call)."""
        return None if self._tasks else await self.node()

    async def prepare(self) -> str:
        """Load the networks, prepare the avatar (as ``talkloop serve`` does at start:
        ``prepare_avatar``) and make the call's server, before any page is here (a warm actor
        waits like this for the next page). Returns the Ray node id."""
        spec = self.spec
        pipeline = await asyncio.to_thread(build_pipeline, build_config(**spec.config))
        await asyncio.to_thread(prepare_avatar, pipeline, spec.reference, spec.prompt)
        factory = spec.mirror_factory
        self.server = AvatarServer(
            pipeline,
            spec.reference,
            spec.prompt,
            spec.call_config,
            1,
            spec.notice,
            mirror_factory=(lambda _n: factory(self.number)) if factory else None,
            offer_timeout_s=spec.offer_timeout_s,
            ice=spec.ice,
        )
        self.outbox = asyncio.Queue()
        self.page = RelaySocket("page", self.outbox)
        freeze_loaded()  # as a single server does: full GC passes skip what the call loaded
        return await self.node()

    async def start(self, query: dict[str, list[str]], number: int) -> None:
        """Serve the page's connection (its ``query``) as call ``number`` of the front."""
        self.number = number
        self._tasks.append(asyncio.get_running_loop().create_task(self._serve_page(query)))

    async def _serve_page(self, query: dict[str, list[str]]) -> None:
        try:
            await self.server.signaling.serve(self.page, query)
        finally:
            await self.server.stop()
            self.outbox.put_nowait(("page", "ended", None))

    async def page_messages(self, raws: list[str | bytes]) -> None:
        for raw in raws:
            self.page.feed(raw)

    async def page_closed(self) -> None:
        self.page.end()

    async def agent_open(self, channel: str, query: dict[str, list[str]]) -> None:
        """An agent joined at the front (``/ws?token=...&role=agent``): serve it here."""
        relay = self.agents[channel] = RelaySocket(channel, self.outbox)

        async def serve() -> None:
            try:
                await self.server.agents.serve(relay, query)
            finally:
                self.agents.pop(channel, None)

        self._tasks.append(asyncio.get_running_loop().create_task(serve()))

    async def agent_messages(self, channel: str, raws: list[str | bytes]) -> None:
        relay = self.agents.get(channel)
        for raw in raws if relay is not None else ():
            relay.feed(raw)

    async def agent_closed(self, channel: str) -> None:
        relay = self.agents.get(channel)
        if relay is not None:
            relay.end()

    async def poll(self, wait_s: float) -> list[tuple[str, str, object]]:
        """What the call sent since the last poll; waits up to ``wait_s`` for the first item."""
        try:
            first = await asyncio.wait_for(self.outbox.get(), wait_s)
        except TimeoutError:
            return []
        items = [first]
        while not self.outbox.empty():
            items.append(self.outbox.get_nowait())
        return items

    async def close(self) -> None:
        """End the call now (the front is stopping)."""
        if self.page is not None:
            self.page.end()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), 10)

"""ClusterServer: `talkloop serve --cluster`, the front that places each call on a Ray actor.

The front loads no networks. It composes the single process's admission
(``talkloop/rtc/admission.py``: the page over HTTP, TLS, access token, origins, per-address cap)
with its own two routes: a page's websocket becomes one ``CallHost`` actor
(``talkloop/rtc/call_host.py``) that requests one ``talkloop_slot``, so Ray places it on a node with
a free slot (the cluster's slots are the front's slot pool); an agent's websocket is relayed to
the actor of its call, after the agent endpoint's refusals (``talkloop/rtc/agent_endpoint.py``:
an unknown token, not an agent, a second agent). The actor owns the call and runs the single
process's page signaling and agent endpoint on what the front relays to it; the front forwards
what it sends back. Media never passes through the front.

Capacity and faults:
- The front keeps ``warm`` actors placed and loaded while slots are free, so a page starts its
  call without waiting for a new process to start and load the networks.
- No free slot: the page gets ``busy`` at once (the front counts the cluster's slots against its
  calls and warm actors before it places; a call that Ray still cannot place within
  ``place_timeout_s``, e.g. on a node being drained, gets ``busy`` too). Nothing queues.
- The actor or its node dies: its page and agent get ``error {code: "worker_lost"}`` within
  ``POLL_S + lost_after_s`` (the actor answers every poll within ``POLL_S``; silence longer than
  that is loss, whether Ray has noticed yet or not); the slot comes back when the node does.
  Other calls run in other actors and are untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import secrets
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from talkloop.pipeline.cluster.connect import CALL_NAMESPACE, SLOT, connect, import_ray
from talkloop.pipeline.core.config import TalkloopConfig
from talkloop.rtc.admission import WEB_DIR, Admission, Query
from talkloop.rtc.agent_endpoint import (
    refuse_second_agent,
    refuse_unknown_token,
    refuse_unless_agent,
)
from talkloop.rtc.call import CallConfig
from talkloop.rtc.call_host import CallHost, HostSpec
from talkloop.rtc.ice import IceConfig
from talkloop.rtc.protocol import HELLO, error
from talkloop.rtc.security import OFFER_TIMEOUT_S, AccessPolicy

log = logging.getLogger("talkloop.cluster")

POLL_S = 1.0  # the actor answers a poll at least this often
LOST_AFTER_S = 4.0  # a poll unanswered this long past POLL_S: the actor or its node is gone
WARM_ACTORS = 1  # placed, loaded actors waiting for the next page
PLACE_TIMEOUT_S = 60.0  # Ray must start the actor on a node within this (else: busy)
OPEN_TIMEOUT_S = 180.0  # loading the networks on the node
RELAY_TIMEOUT_S = 10.0  # one relayed message


@dataclass(eq=False)
class Host:
    """A placed, prepared CallHost actor (networks loaded) that no page uses yet."""

    actor: object
    node: str


@dataclass(eq=False)
class RemoteCall:
    """The front's record of one placed call: the actor and the connections it relays."""

    actor: object  # the CallHost actor handle
    ws: ServerConnection  # the page's websocket
    number: int
    node: str  # the Ray node id it runs on
    token: str = ""  # learnt from the actor's hello to the page (HELLO)
    agent: ServerConnection | None = None
    agent_channel: str = ""
    agents_seen: int = 0
    lost: bool = False
    ended: bool = False  # released by the front: errors after this are not losses
    tasks: list[asyncio.Task] = field(default_factory=list)


class ClusterServer:
    """The front of a cluster: the single process's admission (``Admission``: HTTP, TLS, access
    checks), with calls placed on Ray actors instead of run here.

    Args:
        spec: the settings of every call (config, avatar, prompt, ICE, mirrors).
        access: who may connect; default as ``Admission``'s.
        web_dir: the page's folder.
        place_timeout_s: how long Ray may take to start a call's actor before the page gets
            ``busy``.
        lost_after_s: silence from an actor (past ``POLL_S``) after which its call is lost.
        warm: actors kept placed and loaded, waiting for the next pages (while slots are
            free): a page then starts its call at once instead of waiting for a new process
            to start and load the networks (docs/scaling.md, Figures).
    """

    def __init__(
        self,
        spec: HostSpec,
        access: AccessPolicy | None = None,
        web_dir: Path = WEB_DIR,
        place_timeout_s: float = PLACE_TIMEOUT_S,
        lost_after_s: float = LOST_AFTER_S,
        warm: int = WARM_ACTORS,
    ) -> None:
        self.ray = import_ray()
        self.admission = Admission(self._place, self._agent, access, web_dir)
        self.place_timeout_s = place_timeout_s
        self.lost_after_s = lost_after_s
        self.spec_ref = self.ray.put(spec)
        self.host_class = self.ray.remote(CallHost)
        self.warm = warm
        self.placed: list[RemoteCall] = []  # calls with an actor (placing or running)
        self.by_token: dict[str, RemoteCall] = {}
        self.idle: list[Host] = []  # warm actors waiting for a page
        self._warming: list[asyncio.Future[Host]] = []  # actors being placed and prepared
        self._claiming = 0  # pages holding a slot while their actor is taken and started
        self._numbers: set[int] = set()  # call numbers of running calls

    # -- capacity ------------------------------------------------------------------------------

    def free_slots(self) -> int:
        """Slots of the cluster that no call or actor of this front holds or is about to."""
        total = int(self.ray.cluster_resources().get(SLOT, 0))
        mine = len(self.placed) + len(self.idle) + len(self._warming) + self._claiming
        return total - mine

    async def _prepare(self) -> Host:
        """A new actor, placed (within ``place_timeout_s``) and with its networks loaded."""
        actor = self.host_class.options(
            resources={SLOT: 1},
            num_cpus=0,  # slots decide where calls go; CPUs are left to batch rows
            max_restarts=0,  # a call does not survive its process: the page is told instead
            max_concurrency=64,
            name=f"talkloop-call-{secrets.token_hex(6)}",
            namespace=CALL_NAMESPACE,
        ).remote(self.spec_ref)
        try:
            node = await asyncio.wait_for(actor.node.remote(), self.place_timeout_s)
            await asyncio.wait_for(actor.prepare.remote(), OPEN_TIMEOUT_S)
        except BaseException:
            self.ray.kill(actor, no_restart=True)
            raise
        return Host(actor, node)

    def _replenish(self) -> None:
        """Keep ``warm`` actors placed and loaded while slots are free."""
        while len(self.idle) + len(self._warming) < self.warm and self.free_slots() >= 1:
            self._warm_one()

    def _warm_one(self) -> None:
        future = asyncio.ensure_future(self._prepare())
        self._warming.append(future)
        future.add_done_callback(self._warmed)

    def _warmed(self, future: asyncio.Future) -> None:
        if future not in self._warming:  # a page took it while it was warming
            return
        self._warming.remove(future)
        if future.cancelled():
            return
        if future.exception() is not None:  # e.g. no node could take it: try again later
            log.info("warm actor not ready: %r", future.exception())
            asyncio.get_running_loop().call_later(5.0, self._replenish)
            return
        self.idle.append(future.result())

    async def _take(self) -> Host | None:
        """An actor for a new page: a warm one, the one warming first, or a new one; None
        when every slot is taken. The caller already holds its slot in ``_claiming``."""
        if self.idle:
            return self.idle.pop(0)
        if not self._warming:
            if self.free_slots() < 0:  # the caller's own claim is counted in free_slots
                return None
            self._warm_one()
        return await self._warming.pop(0)

    async def _claim(self, ws: ServerConnection, query: Query) -> RemoteCall | str:
        """The page's call started on an actor and counted in ``placed``, or why not (the
        ``busy`` message). A RayTaskError (the networks would not load) is raised.

        From its first step until then the page holds one slot in ``_claiming``: an actor
        taken from ``idle`` or ``_warming`` is in neither list while it starts, and uncounted it
        let ``_replenish`` warm an actor for a slot that was not free, which then made the next
        page wait ``place_timeout_s`` for it instead of hearing ``busy`` at once."""
        ray = self.ray
        self._claiming += 1
        try:
            for _ in range(2):  # a warm actor whose node died meanwhile: once more, with another
                try:
                    host = await self._take()
                except ray.exceptions.RayTaskError:
                    raise
                except (TimeoutError, ray.exceptions.RayError) as err:
                    log.info("call not placed: %r", err)
                    host = None
                if host is None:
                    return "every call slot of the cluster is taken; try again later"
                # the lowest free number, taken now: another page may be starting meanwhile
                number = min(set(range(1, len(self._numbers) + 2)) - self._numbers)
                self._numbers.add(number)
                try:
                    await asyncio.wait_for(host.actor.start.remote(query, number), RELAY_TIMEOUT_S)
                except (TimeoutError, ray.exceptions.RayError) as err:
                    log.info("warm actor on node %s lost: %r", host.node[:8], err)
                    ray.kill(host.actor, no_restart=True)
                    self._numbers.discard(number)
                    continue
                call = RemoteCall(host.actor, ws, number, host.node)
                self.placed.append(call)
                return call
            return "no node could take the call now; try again later"
        finally:
            self._claiming -= 1

    @property
    def access(self) -> AccessPolicy:
        return self.admission.access

    # -- websocket -----------------------------------------------------------------------------

    async def _agent(self, ws: ServerConnection, query: Query) -> None:
        """The agent route: the agent endpoint's refusals, then relayed to its call's actor."""
        call = self.by_token.get(query["token"][0])
        if call is None or call.lost:
            await refuse_unknown_token(ws)
            return
        if await refuse_unless_agent(ws, query):
            return
        await self._relay_agent(call, ws, query)

    async def _busy(self, ws: ServerConnection, why: str) -> None:
        with contextlib.suppress(ConnectionClosed):
            await ws.send(error("busy", why))
            await ws.close(1013, "busy")

    async def _place(self, ws: ServerConnection, query: Query) -> None:
        """The page route: the page's call placed on an actor, its messages relayed."""
        try:
            call = await self._claim(ws, query)
        except self.ray.exceptions.RayTaskError as err:  # the networks would not load
            log.warning("could not open a call: %s", err.cause)
            with contextlib.suppress(ConnectionClosed):
                await ws.send(error("internal", f"could not open a call: {err.cause}"))
                await ws.close(1011, "call failed")
            return
        if isinstance(call, str):
            self._replenish()
            await self._busy(ws, call)
            return
        self._replenish()
        log.info("call %d on node %s (%d active)", call.number, call.node[:8], len(self.placed))
        try:
            pump = asyncio.get_running_loop().create_task(self._pump(call))
            call.tasks.append(pump)
            await self._forward(ws, call, call.actor.page_messages.remote)
        except ConnectionClosed:
            pass
        except (TimeoutError, self.ray.exceptions.RayError) as err:
            await self._lost(call, err)
        finally:
            await self._release(call)
            self._replenish()

    async def _relay_agent(self, call: RemoteCall, ws: ServerConnection, query: Query) -> None:
        if call.agent is not None:
            await refuse_second_agent(ws)
            return
        call.agents_seen += 1
        channel = f"agent{call.agents_seen}"
        call.agent, call.agent_channel = ws, channel
        actor = call.actor
        try:
            await asyncio.wait_for(actor.agent_open.remote(channel, query), RELAY_TIMEOUT_S)
            await self._forward(ws, call, functools.partial(actor.agent_messages.remote, channel))
        except ConnectionClosed:
            pass
        except (TimeoutError, self.ray.exceptions.RayError) as err:
            await self._lost(call, err)
        finally:
            if call.agent is ws:
                call.agent = None
            if not call.lost:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(actor.agent_closed.remote(channel), RELAY_TIMEOUT_S)

    @staticmethod
    async def _forward(ws: ServerConnection, call: RemoteCall, deliver) -> None:
        """Relay ``ws``'s messages to the actor in order until it closes. What arrives while one
        delivery is in flight goes in the next as one batch: an agent's 50 audio messages a
        second must not wait for 50 round trips to the worker, one after the other."""
        pending: list[str | bytes] = []
        arrived = asyncio.Event()
        done = False

        async def read() -> None:
            nonlocal done
            try:
                async for raw in ws:
                    pending.append(raw)
                    arrived.set()
            finally:
                done = True
                arrived.set()

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while not call.lost:
                await arrived.wait()
                arrived.clear()
                if pending:
                    batch = pending[:]
                    pending.clear()
                    await asyncio.wait_for(deliver(batch), RELAY_TIMEOUT_S)
                if done and not pending:
                    break
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await reader

    async def _pump(self, call: RemoteCall) -> None:
        """Forward what the actor sends to the page and the agent, until the call ends."""
        ray = self.ray
        while True:
            try:
                items = await asyncio.wait_for(
                    call.actor.poll.remote(POLL_S), POLL_S + self.lost_after_s
                )
            except (TimeoutError, ray.exceptions.RayError) as err:
                await self._lost(call, err)
                return
            for channel, kind, payload in items:
                if kind == "ended":
                    return
                if channel == "page":
                    target = call.ws
                    if not call.token and kind == "msg":
                        self._learn_token(call, payload)
                else:
                    target = call.agent if channel == call.agent_channel else None
                if target is None:
                    continue
                with contextlib.suppress(ConnectionClosed):
                    if kind == "msg":
                        await target.send(payload)
                    elif kind == "close":
                        await target.close(*payload)

    def _learn_token(self, call: RemoteCall, payload: object) -> None:
        with contextlib.suppress(ValueError, TypeError):
            msg = json.loads(payload)
            if isinstance(msg, dict) and msg.get("type") == HELLO:
                call.token = msg["token"]
                self.by_token[call.token] = call

    async def _lost(self, call: RemoteCall, err: BaseException) -> None:
        """The actor or its node is gone: tell the page and the agent, once."""
        if call.lost or call.ended:
            return
        call.lost = True
        log.warning("call %d on node %s lost: %r", call.number, call.node[:8], err)
        msg = error(
            "worker_lost",
            "the machine running this call stopped; the call has ended, start a new one",
        )
        targets = [ws for ws in (call.ws, call.agent) if ws is not None]
        for ws in targets:  # both are told before either close handshake is waited for
            with contextlib.suppress(Exception):
                await ws.send(msg)
        for ws in targets:
            with contextlib.suppress(Exception):
                await ws.close(1011, "worker lost")

    async def _release(self, call: RemoteCall) -> None:
        """The page left or the call ended: let the actor finish, then free its slot."""
        if not call.lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(call.actor.page_closed.remote(), RELAY_TIMEOUT_S)
        # The pump returns when the actor's call has ended (or, lost, once it has told both).
        for task in call.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), POLL_S + self.lost_after_s)
        call.ended = True
        for task in call.tasks:
            task.cancel()
        if call.agent is not None:
            with contextlib.suppress(Exception):
                await call.agent.close()
        self.ray.kill(call.actor, no_restart=True)
        self.by_token.pop(call.token, None)
        if call in self.placed:
            self.placed.remove(call)
        self._numbers.discard(call.number)
        log.info("call %d ended (%d active)", call.number, len(self.placed))

    # -- running -------------------------------------------------------------------------------

    async def stop(self) -> None:
        for call in list(self.placed):
            with contextlib.suppress(Exception):
                await call.ws.close(1001, "server stopping")
        for _ in range(100):  # each page's handler releases its call
            if not self.placed:
                break
            await asyncio.sleep(0.05)
        for call in list(self.placed):
            self.ray.kill(call.actor, no_restart=True)
        self.warm = 0
        for future in self._warming:
            future.cancel()  # _prepare kills its actor
        for host in self.idle:
            self.ray.kill(host.actor, no_restart=True)
        self.idle.clear()
        await self.admission.close()

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        """Start listening (https/wss with ``ssl_context``); returns the port (for port 0)."""
        bound = await self.admission.listen(host, port, ssl_context)
        self._replenish()
        return bound


def cluster_server(
    cluster: str,
    config: TalkloopConfig,
    reference: np.ndarray,
    prompt: str,
    max_calls: int,
    call_config: CallConfig,
    notice: str,
    mirror_factory=None,
    access: AccessPolicy | None = None,
    offer_timeout_s: float = OFFER_TIMEOUT_S,
    ice: IceConfig | None = None,
) -> tuple[ClusterServer, str]:
    """Join (or start) the cluster and make its front; returns it and a line saying where calls
    run. ``max_calls`` is the slot count of a local instance that ``auto`` starts."""
    where = connect(cluster, slots=max_calls)
    spec = HostSpec(
        config.model_dump(mode="json"),
        reference,
        prompt,
        call_config,
        notice,
        ice or IceConfig(),
        offer_timeout_s,
        mirror_factory,
    )
    server = ClusterServer(spec, access)
    slots = int(server.ray.cluster_resources().get(SLOT, 0))
    line = f"calls run on {where}: {slots} call slot(s) now"
    if slots == 0:
        line += " (add workers: talkloop worker --address HEAD:PORT --slots N)"
    return server, line


__all__ = ["ClusterServer", "RemoteCall", "cluster_server"]

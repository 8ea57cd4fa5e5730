"""The cluster front's slot count, step by step: pages that arrive together each hold their slot
until their call is placed, so the front never warms an actor for a slot that is not free and
the page after the last slot hears ``busy`` at once.

The ordering that matters (one page's actor still starting while another page's call is
placed) cannot be forced on a real Ray cluster; here Ray is replaced by actors whose methods
finish when the test says so. tests/cluster/test_cluster.py runs the same front on a real one.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from talkloop.pipeline.cluster.connect import SLOT
from talkloop.rtc import cluster as front

pytestmark = pytest.mark.unit


class Method:
    """``actor.name.remote(...)``: finishes when its gate opens."""

    def __init__(self, value: object = None) -> None:
        self.gate = asyncio.Event()
        self.value = value

    def remote(self, *args: object):
        async def wait() -> object:
            await self.gate.wait()
            return self.value

        return wait()


class Actor:
    def __init__(self, number: int) -> None:
        self.node = Method(f"node{number}")
        self.prepare = Method()
        self.start = Method()


class StepRay:
    """The calls ClusterServer makes on ``ray``, on a cluster of ``slots`` call slots."""

    RayError = type("RayError", (Exception,), {})
    # as in Ray: a task's own error is a RayError too (the front must tell them apart)
    exceptions = types.SimpleNamespace(
        RayError=RayError, RayTaskError=type("RayTaskError", (RayError,), {})
    )

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.actors: list[Actor] = []
        self.killed: list[Actor] = []

    def put(self, value: object) -> object:
        return value

    def cluster_resources(self) -> dict:
        return {SLOT: self.slots}

    def kill(self, actor: Actor, no_restart: bool) -> None:
        self.killed.append(actor)

    def remote(self, cls: type):
        ray = self

        class Handle:
            def options(self, **kw: object) -> Handle:
                return self

            def remote(self, spec: object) -> Actor:
                ray.actors.append(Actor(len(ray.actors)))
                return ray.actors[-1]

        return Handle()


def ready(actor: Actor) -> None:
    actor.node.gate.set()
    actor.prepare.gate.set()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_two_pages_at_once_take_both_slots_and_a_third_is_busy_at_once(monkeypatch) -> None:
    ray = StepRay(slots=2)
    monkeypatch.setattr(front, "import_ray", lambda: ray)

    async def scenario() -> None:
        server = front.ClusterServer(spec=None, warm=1)
        server._replenish()  # the warm actor, still starting
        a = asyncio.ensure_future(server._claim("page a", {}))
        b = asyncio.ensure_future(server._claim("page b", {}))
        await settle()
        assert len(ray.actors) == 2  # a waits for the warm actor, b for one of its own
        for actor in ray.actors:
            ready(actor)
        await settle()
        # Both actors are placed and starting their calls; a's call starts first. The front
        # then warms another actor only if a slot is free: b's is not.
        ray.actors[0].start.gate.set()
        call_a = await a
        server._replenish()
        await settle()
        assert len(ray.actors) == 2 and server.free_slots() == 0
        ray.actors[1].start.gate.set()
        call_b = await b
        assert [call.ws for call in server.placed] == [call_a.ws, call_b.ws] == ["page a", "page b"]
        assert call_a.node != call_b.node and {call_a.number, call_b.number} == {1, 2}
        server._replenish()
        third = asyncio.ensure_future(server._claim("page c", {}))
        await settle()
        assert third.done(), "the third page waits for an actor no slot can hold"
        assert "every call slot of the cluster is taken" in third.result()
        assert len(ray.actors) == 2 and not ray.killed and server._claiming == 0

    asyncio.run(scenario())


def test_a_warm_actor_lost_while_starting_gives_its_slot_to_a_new_one(monkeypatch) -> None:
    ray = StepRay(slots=1)
    monkeypatch.setattr(front, "import_ray", lambda: ray)

    async def scenario() -> None:
        server = front.ClusterServer(spec=None, warm=1)
        server._replenish()
        await settle()
        ready(ray.actors[0])
        await settle()
        assert len(server.idle) == 1

        async def lost(*args: object) -> None:
            raise ray.exceptions.RayError("its node died")

        ray.actors[0].start.remote = lost
        page = asyncio.ensure_future(server._claim("page", {}))
        await settle()
        assert ray.killed == [ray.actors[0]]  # the lost one is given up ...
        assert len(ray.actors) == 2  # ... and its slot goes to a new actor for the same page
        ready(ray.actors[1])
        ray.actors[1].start.gate.set()
        call = await page
        assert call.node == "node1" and server.placed == [call] and server.free_slots() == 0

    asyncio.run(scenario())

"""The portrait family in the framework: streaming == batch, order, rolling memory, the graph."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from talkloop.pipeline.core.clock import frame_start_sample, frames_for_samples
from talkloop.pipeline.core.engine import Engine
from talkloop.pipeline.core.errors import InputError, SessionClosedError
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.session import Session, step_sessions
from talkloop.pipeline.core.workers import Bound
from talkloop.pipeline.models.portrait import stages
from talkloop.pipeline.models.registry import build_pipeline, load_modules, load_reference
from talkloop.rtc import call_host
from talkloop.rtc.call import CallConfig
from talkloop.rtc.ice import IceConfig
from talkloop.rtc.server import prepare_avatar

from support import (
    CollectSink,
    liven,
    memory_reports,
    render_batch,
    render_streaming,
    tiny_config,
)

pytestmark = pytest.mark.unit

RATE = 16000
SIZE = 192  # small frames keep the renderer cheap; the face is still ~80 px tall


def portrait_config(**overrides):
    return tiny_config(
        video={"width": SIZE, "height": SIZE},
        model={"family": "portrait"},
        **overrides,
    )


@pytest.fixture(scope="module")
def modules():
    mods = load_modules(portrait_config())
    liven(mods)  # untrained heads start at zero: make the motion net's output move
    return mods


@pytest.fixture(scope="module")
def pipeline(modules) -> Pipeline:
    return build_pipeline(portrait_config(), modules)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    return load_reference(portrait_config(), None)


def test_the_default_portrait_is_framed_to_the_video_size(reference) -> None:
    assert reference.shape == (SIZE, SIZE, 3) and reference.dtype == np.uint8


def test_streaming_and_batch_give_bit_identical_frames(pipeline, reference, speech) -> None:
    audio = speech[: int(2.3 * RATE)]
    batch = render_batch(pipeline, audio, reference)
    stream = render_streaming(pipeline, audio, reference)
    a, b = batch.all_frames(), stream.all_frames()
    assert a.shape == b.shape == (frames_for_samples(audio.shape[0], 25, RATE), SIZE, SIZE, 3)
    assert np.array_equal(a, b)
    assert np.array_equal(batch.all_audio(), stream.all_audio())
    assert np.abs(np.diff(a.astype(np.int16), axis=0)).mean() > 0  # the face moves


class HeldSink(CollectSink):
    """Keeps what it is given; its first write waits for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.held, self.release = threading.Event(), threading.Event()

    def write(self, video, audio) -> None:
        if not self.held.is_set():
            self.held.set()
            assert self.release.wait(30)
        super().write(video, audio)


def overlapped(pipeline, reference, audio):
    """A session on all of ``audio`` whose first chunk's frames are held in its sink while its
    second chunk is made (``step_sessions``' ``computed``, as the live engine runs it on another
    worker). Returns the session, its sink, the two steps' threads and their results."""
    sink = HeldSink()
    session = pipeline.open_session(reference.copy(), sinks=[sink])
    session.push_audio(audio)
    session.end_audio()
    threads, results, second_made = [], [], threading.Event()

    def run() -> None:
        results.append(step_sessions([session], computed=computed))

    def computed(s) -> None:
        if len(threads) < 2:  # the next chunk, begun at once on another thread
            threads.append(threading.Thread(target=run))
            threads[-1].start()
        elif s.state.next_n == 2:
            second_made.set()

    computed(session)  # the first chunk, on a thread of its own
    assert sink.held.wait(30)
    assert second_made.wait(30)  # while the first chunk's frames are held
    return session, sink, threads, results


def test_a_chunk_is_made_while_the_last_ones_frames_are_published(
    pipeline, reference, speech
) -> None:
    """A session's next chunk may begin once its motion is made (``computed``: the live engine
    begins it on another worker) while this chunk's frames are still rendered and published;
    its own frames wait for them, and the frames are those of a session stepped in turn."""
    audio = speech[: int(1.0 * RATE)]
    expected = render_batch(pipeline, audio, reference)
    session, sink, threads, results = overlapped(pipeline, reference, audio)
    assert session.state.next_n == 2 and sink.first_indices == [] and session.made_until == 0
    sink.release.set()
    for thread in threads:
        thread.join(30)
    chunks = [pipeline.timeline.n_chunk(k) for k in (0, 1)]
    assert [r[0] for r in results] == [n.length for n in chunks]
    assert sink.first_indices == [n.start for n in chunks]
    while session.step():
        pass
    session.close()
    assert np.array_equal(sink.all_frames(), expected.all_frames())
    assert np.array_equal(sink.all_audio(), expected.all_audio())


def test_a_chunk_skipped_behind_unpublished_ones_is_passed_over_after_them(
    pipeline, reference, speech
) -> None:
    """Live catch-up while two chunks are made but not yet published: the skipped chunk counts
    as done once they are, and the next chunk's frames follow theirs."""
    audio = speech[: int(1.0 * RATE)]
    session, sink, threads, _ = overlapped(pipeline, reference, audio)
    chunks = [pipeline.timeline.n_chunk(k) for k in range(4)]
    assert session.skip_chunk() == chunks[2].length and session.made_until == 0
    sink.release.set()
    for thread in threads:
        thread.join(30)
    assert session.made_until == chunks[2].stop
    assert session.step() == chunks[3].length
    assert sink.first_indices == [chunks[k].start for k in (0, 1, 3)]
    session.close()


@pytest.mark.parametrize("point", [1, 2])
def test_a_rewind_goes_back_before_the_last_chunks_frames_are_out(
    pipeline, reference, speech, point
) -> None:
    """A rewind (an agent's reply starting early) goes back as soon as the chunk in hand is
    made, not once its frames are out: the chunks from the rewind's point on that are made but
    not published are dropped (their frames never rendered), the chunks before it still go out
    first, and the frames are those of the same rewind made after everything was published,
    less the stale frames that one published."""
    audio = speech[: int(1.0 * RATE)]
    chunks = [pipeline.timeline.n_chunk(k) for k in range(4)]
    frame = chunks[point].start
    reply = np.roll(speech, 9000)[: audio.shape[0] - frame_start_sample(frame, 25, RATE)]

    # The same rewind, once both chunks are published: the stale frames of chunk 1 go out too.
    later = CollectSink()
    session = pipeline.open_session(reference.copy(), sinks=[later])
    session.push_audio(audio)
    session.end_audio()
    assert session.step() and session.step()
    before = len(later.frames)
    session.rewind(frame, reply)
    while session.step():
        pass
    session.close()
    stale = [i for i in range(before) if later.first_indices[i] >= frame]
    kept = [f for i, f in enumerate(later.frames) if i not in stale]

    session, sink, threads, results = overlapped(pipeline, reference, audio)
    assert session.state.next_n == 2 and sink.first_indices == []  # chunk 0's frames are held
    assert frame in session.rewind_points()
    session.rewind(frame, reply)
    assert session.ready()  # at once: it does not wait for chunk 0's frames, nor chunk 1's
    made = threading.Event()
    again = threading.Thread(
        target=step_sessions, args=([session],), kwargs={"computed": lambda s: made.set()}
    )
    again.start()
    assert made.wait(30) and session.state.next_n == point + 1  # made again, frames still held
    sink.release.set()
    for thread in [*threads, again]:
        thread.join(30)
    published = [chunks[0].length, 0 if point == 1 else chunks[1].length]  # dropped: nothing
    assert sorted(r[0] for r in results) == sorted(published)
    while session.step():
        pass
    session.close()
    assert sink.first_indices[:4] == [n.start for n in chunks]
    assert sink.first_indices == sorted(set(sink.first_indices))  # in order, each once
    assert sink.first_indices == [k for i, k in enumerate(later.first_indices) if i not in stale]
    for a, b in zip(sink.frames, kept, strict=True):
        assert np.array_equal(a, b)


def test_a_chunk_being_made_is_not_skipped_under_its_maker(pipeline, reference, speech) -> None:
    """The live engine looks at which sessions are free, then skips the chunks of those past
    their lag bound, while another worker may take one of them meanwhile: a skip that comes
    while the session's next chunk is being made is refused. Before, that chunk counted as both
    made and skipped, its maker then moved the timeline past the next chunk too, and every
    later chunk waited for that one's frames forever (a server's calls froze under overload)."""
    audio = speech[: int(1.0 * RATE)]
    expected = render_batch(pipeline, audio, reference)
    sink = CollectSink()
    session = pipeline.open_session(reference.copy(), sinks=[sink])
    session.push_audio(audio)
    session.end_audio()
    assert session.step() > 0  # N0, which is never skipped
    inside, go = threading.Event(), threading.Event()

    def hold(phase, stage) -> None:  # the second chunk's motion, being made
        if phase == "n_chunk" and not inside.is_set():
            inside.set()
            go.wait(30)

    pipeline.stage_hooks.append(hold)
    maker = threading.Thread(target=session.step)
    try:
        maker.start()
        assert inside.wait(30)
        assert session.skip_chunk() == 0
    finally:
        go.set()
        maker.join(30)
        pipeline.stage_hooks.remove(hold)
    done = threading.Thread(target=lambda: [None for _ in iter(session.step, 0)])
    done.start()
    done.join(60)
    stuck = done.is_alive()
    session.close()  # wakes a step that waits for frames no chunk publishes
    assert not stuck
    assert session.stats.skipped_frames == 0
    assert np.array_equal(sink.all_frames(), expected.all_frames())


def test_an_overloaded_engine_publishes_every_session_in_order_and_finishes(
    pipeline, reference, speech
) -> None:
    """Two engine workers and four sessions far behind, whose lag bounds take a moment to
    compute and say skip or make at random: a worker looks at the free sessions, then skips,
    while the other takes sessions and makes their chunks. Every session's frames go out in
    order, each frame once, made or skipped, and every session finishes. A stress test of the
    engine's threads, not a sure catch: the race that froze such sessions (a skip under a
    chunk's maker, ``test_a_chunk_being_made_is_not_skipped_under_its_maker``) failed it in
    one of four runs before its fix."""
    engine = Engine(max_batch=4, publish_workers=2, workers=2)
    audio = speech[: int(4.0 * RATE)]
    total = frames_for_samples(audio.shape[0], 25, RATE)
    coin = random.Random(0)
    errors: list[BaseException] = []

    def bound() -> float:
        time.sleep(0.005)  # another worker may take the session meanwhile
        return 0.0 if coin.random() < 0.5 else 60.0

    sinks, sessions, streams = [], [], []
    for i in range(4):
        sinks.append(CollectSink())
        sessions.append(pipeline.open_session(reference.copy(), sinks=[sinks[-1]], seed=i))
        sessions[-1].push_audio(audio)
        sessions[-1].end_audio()
    for session in sessions:
        streams.append(engine.add(session, lambda frame: 0.0, bound, errors.append))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
        s.finished and s.made_until == total for s in sessions
    ):
        time.sleep(0.05)
    finished = [s.made_until for s in sessions]
    for session in sessions:
        session.close()  # wakes a chunk that waits for frames no chunk would publish
    for stream in streams:
        engine.remove(stream, timeout=30)
    assert errors == [] and finished == [total] * 4
    for session, sink in zip(sessions, sinks, strict=True):
        starts, made = sink.first_indices, [f.shape[0] for f in sink.frames]
        assert starts == sorted(starts) and len(set(starts)) == len(starts)
        assert all(a + n <= b for a, n, b in zip(starts, made, starts[1:], strict=False))
        assert sum(made) + session.stats.skipped_frames == total
    assert sum(s.stats.skipped_frames for s in sessions) > 0  # the bounds did make it skip


def test_every_sample_published_once_in_display_order(pipeline, reference, speech) -> None:
    audio = speech[: int(1.37 * RATE)]
    sink = render_batch(pipeline, audio, reference)
    assert sink.all_frames().shape[0] == frames_for_samples(audio.shape[0], 25, RATE)
    expected_first = np.cumsum([0] + [f.shape[0] for f in sink.frames[:-1]]).tolist()
    assert sink.first_indices == expected_first
    for first, first_sample in zip(sink.first_indices, sink.first_samples, strict=True):
        assert first_sample == frame_start_sample(first, 25, RATE)
    assert np.array_equal(sink.all_audio(), audio)
    assert sink.closed and not sink.aborted


def test_session_state_size_is_constant(modules, reference, speech) -> None:
    """Rolling memory: the state after chunk 20 and after chunk 150 holds the same tensors."""
    config = portrait_config(schedule={"first_len": 2, "n_len": 3, "i_len": 1, "ctx_len": 1})
    pipeline = build_pipeline(config, modules)
    reports, _ = memory_reports(pipeline, reference, speech, (20, 150))
    assert set(reports) == {20, 150}
    assert reports[20] == reports[150]
    assert {"a2v_reference", "context_latents", "context_audio", "audio"} <= set(reports[150])
    # The renderer is counted with all it holds: at least the photo and its warp weights.
    shape, kind, nbytes = reports[150]["renderer"]
    assert kind == "PortraitRenderer" and nbytes > SIZE * SIZE * 3


class _LoggedSink(CollectSink):
    """Also notes in a log shared by several sessions' sinks which session published what."""

    def __init__(self, name: int, log: list[tuple[int, int, int]]) -> None:
        super().__init__()
        self.name, self.log = name, log

    def write(self, video, audio) -> None:
        super().write(video, audio)
        self.log.append((self.name, video.first_index, video.frames.shape[0]))


@pytest.mark.parametrize("i_len", [0, 1])
def test_a_batch_publishes_every_first_frame_before_any_second(modules, speech, i_len) -> None:
    """Batched live chunks go out in two waves (the family's ``publish_per_frame``), with the
    frames and audio of the same batch published chunk by chunk."""
    config = portrait_config(schedule={"first_len": 2, "n_len": 2, "i_len": i_len, "ctx_len": 2})
    pipeline = build_pipeline(config, modules)
    assert pipeline.publish_per_frame
    reference = load_reference(config, None)
    audio = [np.roll(speech, 4000 * i)[: int(1.1 * RATE)] for i in range(3)]

    def run(per_frame: bool, threads: int) -> tuple[list[CollectSink], list[tuple[int, int, int]]]:
        pipeline.publish_per_frame = per_frame
        log: list[tuple[int, int, int]] = []
        sinks = [_LoggedSink(i, log) for i in range(3)]
        sessions = [pipeline.open_session(reference, "", [sinks[i]], seed=i) for i in range(3)]
        for s, a in zip(sessions, audio, strict=True):
            s.push_audio(a)
            s.end_audio()
        with ThreadPoolExecutor(max(threads, 1)) as pool:
            while any(s.ready() for s in sessions):
                results = step_sessions(sessions, pool if threads else None)
                assert all(r in (0, 2) for r in results)  # no error, whole chunks
        for s in sessions:
            s.close()
        return sinks, log

    (whole, _), (waves, log), (threaded, _) = run(False, 2), run(True, 0), run(True, 2)
    for a, b, c in zip(whole, waves, threaded, strict=True):
        assert a.all_frames().shape[0] >= 20
        for other in (b, c):
            np.testing.assert_array_equal(a.all_frames(), other.all_frames())
            np.testing.assert_array_equal(a.all_audio(), other.all_audio())
            assert set(map(len, other.frames)) == {1}  # frame by frame
    # One thread: each step published three first frames, then three second frames (on a pool
    # every first frame starts before any second one; they may finish in either order).
    for step in range(0, len(log), 6):
        firsts, seconds = log[step : step + 3], log[step + 3 : step + 6]
        assert sorted(n for n, _, _ in firsts) == [0, 1, 2]
        assert len({first for _, first, _ in firsts}) == 1
        assert all(first == firsts[0][1] + 1 for _, first, _ in seconds)


def test_a_session_failing_in_the_second_wave_fails_alone(modules, reference, speech) -> None:
    class Breaks(CollectSink):
        def write(self, video, audio) -> None:
            if video.first_index % 2:  # every chunk's second frame
                raise OSError("disk full")
            super().write(video, audio)

    pipeline = build_pipeline(portrait_config(), modules)
    sinks = [CollectSink(), Breaks(), CollectSink()]
    sessions = [
        pipeline.open_session(reference, "", [sink], seed=i) for i, sink in enumerate(sinks)
    ]
    for s in sessions:
        s.push_audio(speech[: int(0.5 * RATE)])
    with ThreadPoolExecutor(2) as pool:
        results = step_sessions(sessions, pool)
    assert results[0] == results[2] == 2
    assert isinstance(results[1], OSError)
    assert [len(sink.frames) for sink in sinks] == [2, 1, 2]  # its first frame went out
    for s in sessions:
        s.close()


def test_a_reference_without_a_face_is_refused(pipeline) -> None:
    grey = np.full((SIZE, SIZE, 3), 128, np.uint8)
    with pytest.raises(InputError, match="no face"):
        pipeline.open_session(grey)


def test_render_processes_make_the_frames_the_session_thread_makes(
    modules, reference, speech, monkeypatch
) -> None:
    """``model.render_processes`` (what live calls use): the photo's renderer goes to the
    worker processes when its first session opens, later sessions of the photo render with
    the copies there, and each chunk's frames are split over the workers; the frames are
    bit-identical."""
    audio = speech[: int(1.5 * RATE)]
    here = render_batch(pipeline_of(modules, 0), audio, reference).all_frames()
    pooled_pipeline = pipeline_of(modules, 2)
    (stage,) = pooled_pipeline.phases["publish"].stages
    pool = stage.workers.pool
    assert pool is not None and len(pool.pids) == 2
    split = []
    call_parts = Bound.call_parts
    monkeypatch.setattr(
        Bound, "call_parts", lambda b, m, parts: split.append(len(parts)) or call_parts(b, m, parts)
    )
    pooled = render_batch(pooled_pipeline, audio, reference).all_frames()
    assert here.shape == pooled.shape and here.shape[0] >= 30
    assert np.array_equal(here, pooled)
    assert split and set(split) == {2}  # every chunk's frames in both workers
    assert sum(w.bound for w in pool._workers) == 2  # the photo's renderer, in each worker
    binds = []
    bind = type(pool).bind
    monkeypatch.setattr(type(pool), "bind", lambda p, *a, **k: binds.append(1) or bind(p, *a, **k))
    again = render_batch(pooled_pipeline, audio, reference).all_frames()
    assert binds == [] and np.array_equal(again, here)  # a second call start sent nothing


def pipeline_of(modules, processes: int) -> Pipeline:
    config = portrait_config()
    model = config.model.model_copy(update={"render_processes": processes})
    return build_pipeline(config.model_copy(update={"model": model}), modules)


def test_sessions_of_one_photo_share_its_prepared_renderer(modules, reference, speech, monkeypatch):
    """The face models and the renderer run once per photo: a second session of the same photo
    starts from the first's renderer (its arrays shared, its own handle) and makes the same
    frames; a photo changed afterwards by its caller does not change what was prepared."""
    audio = speech[: int(1.0 * RATE)]
    fresh = render_batch(pipeline_of(modules, 0), audio, reference).all_frames()  # made for it
    pipeline = pipeline_of(modules, 0)
    photo = reference.copy()
    first = pipeline.open_session(photo)
    calls = []
    monkeypatch.setattr(stages, "detect_faces", lambda image: calls.append(image) or [])
    photo[:] = 0  # the caller reuses its array: the prepared renderer kept its own copy
    second = pipeline.open_session(reference.copy())
    assert calls == []  # no face detection: the photo was prepared
    a, b = (s.state.fields["renderer"] for s in (first, second))
    assert a is not b and a.image is b.image and np.array_equal(a.image, reference)
    first.close()
    second.close()
    kept = render_batch(pipeline, audio, reference).all_frames()  # from the prepared renderer
    assert np.array_equal(kept, fresh)
    with pytest.raises(InputError, match="no face"):  # another photo is prepared anew
        pipeline.open_session(np.roll(reference, 3, axis=1))
    assert len(calls) == 1


def test_a_server_prepares_its_avatar_before_its_first_call(modules, reference, monkeypatch):
    """``talkloop serve`` prepares its own avatar at start (``prepare_avatar``): its first
    calls open without running the face models (a fifth of a second each, while calls that
    opened with it have chunks due), and the process has made a chunk already (its first
    costs several times a later one)."""
    pipeline = pipeline_of(modules, 0)
    ran: list[tuple[str, str]] = []
    pipeline.stage_hooks.append(lambda phase, stage: ran.append((phase, stage.name)))
    try:
        prepare_avatar(pipeline, reference.copy(), "")
    finally:
        pipeline.stage_hooks.pop()
    assert ("n_chunk", "audio_features") in ran and ("n_chunk", "a2v") in ran
    assert ("publish", "render") in ran
    calls = []
    monkeypatch.setattr(stages, "detect_faces", lambda image: calls.append(image) or [])
    session = pipeline.open_session(reference.copy())
    assert calls == [] and session.state.fields["renderer"] is not None
    session.close()


def test_a_server_whose_avatar_makes_no_frame_stops_at_start(modules, reference, monkeypatch):
    """A pipeline that makes no frame from its first chunk of silence stops ``talkloop serve``
    at start, saying so, instead of serving calls that would never show a face; the session it
    tried is closed."""
    pipeline = pipeline_of(modules, 0)
    opened: list[Session] = []
    open_session = pipeline.open_session
    monkeypatch.setattr(
        pipeline, "open_session", lambda *args: opened.append(open_session(*args)) or opened[-1]
    )
    monkeypatch.setattr(Session, "step", lambda self: 0)
    with pytest.raises(RuntimeError, match="first chunk of silence made no frame"):
        prepare_avatar(pipeline, reference.copy(), "")
    (result,) = step_sessions(opened)
    assert isinstance(result, SessionClosedError)


def test_a_cluster_actor_prepares_its_avatar_before_its_call(reference, monkeypatch):
    """``talkloop serve --cluster``: a call's actor prepares the avatar in ``prepare``, while
    it waits for a page, not when the call's first chunks are due."""
    spec = call_host.HostSpec(
        portrait_config().model_dump(mode="json"),
        reference.copy(),
        "",
        CallConfig(),
        "",
        IceConfig(),
        10.0,
    )
    host = call_host.CallHost(spec)

    async def node(self) -> str:  # where Ray placed the actor: no Ray in this test
        return "node"

    monkeypatch.setattr(call_host.CallHost, "node", node)
    # A server freezes its loaded heap (gc.freeze); the test process is not one.
    monkeypatch.setattr(call_host, "freeze_loaded", lambda: None)
    assert asyncio.run(host.prepare()) == "node"
    calls = []
    monkeypatch.setattr(stages, "detect_faces", lambda image: calls.append(image) or [])
    session = host.server.pipeline.open_session(reference.copy())
    assert calls == [] and session.state.fields["renderer"] is not None
    session.close()


def test_prepared_photos_are_bounded(modules, reference) -> None:
    stage = stages.PortraitReferenceStage()
    photos = [np.roll(reference, k, axis=1) for k in range(stages.PREPARED_PHOTOS + 2)]
    renderers = [stage.prepared(p) for p in photos]
    assert len(stage._prepared) == stages.PREPARED_PHOTOS
    assert stage.prepared(photos[-1]) is renderers[-1]  # kept: used last
    assert stage.prepared(photos[0]) is not renderers[0]  # the oldest went


def test_sessions_of_one_photo_render_in_every_worker(modules, reference) -> None:
    # Sharing the prepared renderer must not pin every call of the default avatar to one
    # worker process: the photo's renderer is held by every worker, once however many sessions
    # use it, and each chunk's frames render in both (tests/core/test_workers.py).
    pipeline = pipeline_of(modules, 2)
    (stage,) = pipeline.phases["publish"].stages
    pool = stage.workers.pool
    before = [w.bound for w in pool._workers]
    sessions = [pipeline.open_session(reference.copy()) for _ in range(2)]
    assert [w.bound - b for w, b in zip(pool._workers, before, strict=True)] == [1, 1]
    for session in sessions:
        session.close()
    # Still there for the photo's next call while it is among the prepared photos.
    assert [w.bound - b for w, b in zip(pool._workers, before, strict=True)] == [1, 1]


def test_sessions_of_a_new_photo_opening_together_make_and_send_it_once(
    modules, reference, monkeypatch
) -> None:
    """Calls that start at one moment with a photo not yet prepared (a fresh server's first
    calls of its avatar): one of them runs the face models and sends the renderer to the
    workers, the others wait for it and use it."""
    pipeline = pipeline_of(modules, 2)
    (stage,) = pipeline.phases["publish"].stages
    pool = stage.workers.pool
    detected, binds = [], []
    detect = stages.detect_faces
    monkeypatch.setattr(stages, "detect_faces", lambda image: detected.append(1) or detect(image))
    bind = type(pool).bind
    monkeypatch.setattr(type(pool), "bind", lambda p, *a, **k: binds.append(1) or bind(p, *a, **k))
    photo = np.ascontiguousarray(reference[:, ::-1])  # mirrored: a photo no test prepared
    start = threading.Barrier(3)

    def open_one(_: int):
        start.wait(timeout=60)
        return pipeline.open_session(photo.copy())

    with ThreadPoolExecutor(3) as pool_of_threads:
        sessions = list(pool_of_threads.map(open_one, range(3)))
    try:
        assert detected == [1] and binds == [1]
        handles = [s.state.fields["renderer"] for s in sessions]
        assert len({id(h) for h in handles}) == 3 and len({id(h.image) for h in handles}) == 1
    finally:
        for s in sessions:
            s.close()

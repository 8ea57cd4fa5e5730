"""The pipeline loop: graph checks, streaming == batch, rolling memory, audio/frame accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from talkloop.pipeline.core.clock import frame_start_sample, frames_for_samples
from talkloop.pipeline.core.errors import InputError, PipelineError, SessionClosedError
from talkloop.pipeline.core.graph import Phase
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.core.stage import Stage, StageContext
from talkloop.pipeline.models.registry import build_pipeline, family_phases

from support import (
    CollectSink,
    blocks,
    make_reference,
    memory_reports,
    render_batch,
    render_streaming,
    tiny_config,
)

pytestmark = pytest.mark.unit

RATE = 16000


# -- graph checks ---------------------------------------------------------------------------------


class _Reads(Stage):
    name = "needs_ghost"
    reads = ("ghost_field",)
    writes = ("latents",)


class _NeedsModule(Stage):
    name = "needs_module"
    needs = ("warp_drive",)


def test_missing_producer_fails_at_construction(tiny_modules) -> None:
    phases = family_phases(tiny_config())
    phases["n_chunk"] = Phase("n_chunk", frozenset({"job"}), [_Reads()])
    with pytest.raises(PipelineError, match=r"stage 'needs_ghost'.*reads 'ghost_field'"):
        Pipeline(tiny_config(), tiny_modules, phases)


def test_missing_module_fails_at_construction(tiny_modules) -> None:
    phases = family_phases(tiny_config())
    phases["publish"].stages = [_NeedsModule(), *phases["publish"].stages]
    with pytest.raises(PipelineError, match=r"stage 'needs_module'.*needs module 'warp_drive'"):
        Pipeline(tiny_config(), tiny_modules, phases)
    partial = {k: v for k, v in tiny_modules.items() if k != "sr"}
    with pytest.raises(PipelineError, match=r"stage 'sr'.*needs module 'sr'"):
        build_pipeline(tiny_config(), partial)


def test_undeclared_field_access_is_an_error() -> None:
    class Sneaky(Stage):
        name = "sneaky"
        reads = ("a",)

    ctx = StageContext(Sneaky(), {"a": 1, "b": 2}, object(), {}, frozenset())
    assert ctx.read("a") == 1
    with pytest.raises(PipelineError, match="reads 'b' without declaring"):
        ctx.read("b")
    with pytest.raises(PipelineError, match="writes 'a' without declaring"):
        ctx.write("a", 3)


# -- the loop -------------------------------------------------------------------------------------


def test_streaming_and_batch_give_bit_identical_frames(tiny_pipeline, speech) -> None:
    audio = speech[: int(2.3 * RATE)]
    batch = render_batch(tiny_pipeline, audio)
    stream = render_streaming(tiny_pipeline, audio)
    a, b = batch.all_frames(), stream.all_frames()
    assert a.shape == b.shape == (frames_for_samples(audio.shape[0], 25, RATE), 64, 64, 3)
    assert np.array_equal(a, b)
    assert np.array_equal(batch.all_audio(), stream.all_audio())
    # and the frames are not trivially constant: the stream moves
    assert np.abs(np.diff(a.astype(np.int16), axis=0)).mean() > 0


def test_same_seed_same_frames_other_seed_differs(tiny_pipeline, speech) -> None:
    audio = speech[:RATE]
    a = render_batch(tiny_pipeline, audio, seed=3).all_frames()
    b = render_batch(tiny_pipeline, audio, seed=3).all_frames()
    c = render_batch(tiny_pipeline, audio, seed=4).all_frames()
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("seconds", [0.01, 0.04, 0.05, 0.33, 1.0, 2.27])
def test_every_sample_published_once_with_its_frame(tiny_pipeline, speech, seconds) -> None:
    audio = speech[: max(1, int(seconds * RATE))]
    sink = render_batch(tiny_pipeline, audio)
    frames = sink.all_frames()
    assert frames.shape[0] == frames_for_samples(audio.shape[0], 25, RATE)
    # Segments arrive in display order, back to back.
    assert sink.first_indices == sorted(sink.first_indices)
    expected_first = np.cumsum([0] + [f.shape[0] for f in sink.frames[:-1]]).tolist()
    assert sink.first_indices == expected_first
    # Each segment carries exactly the audio its frames cover; together: the input, once.
    for first, chunk, first_sample in zip(
        sink.first_indices, sink.frames, sink.first_samples, strict=True
    ):
        assert first_sample == frame_start_sample(first, 25, RATE)
        del chunk
    assert np.array_equal(sink.all_audio(), audio)
    assert sink.closed and not sink.aborted


def test_audio_shorter_than_one_chunk(tiny_pipeline) -> None:
    audio = np.full(100, 0.1, np.float32)  # 6 ms: less than one frame
    sink = render_batch(tiny_pipeline, audio)
    assert sink.all_frames().shape[0] == 1
    assert np.array_equal(sink.all_audio(), audio)


def test_empty_audio_gives_no_frames(tiny_pipeline) -> None:
    sink = render_batch(tiny_pipeline, np.zeros(0, np.float32))
    assert sink.frames == [] and sink.closed


def test_session_state_size_is_constant(tiny_modules, speech) -> None:
    """Rolling memory: the state after chunk 20 and after chunk 400 holds the same tensors."""
    config = tiny_config(schedule={"first_len": 2, "n_len": 3, "i_len": 1, "ctx_len": 1})
    pipeline = build_pipeline(config, tiny_modules)
    reports, chunks = memory_reports(pipeline, make_reference(), speech, (20, 400))
    assert chunks >= 400
    assert set(reports) == {20, 400}
    assert reports[20] == reports[400]
    assert set(reports[400]) == {
        "ref_latent",
        "ref_latent_hr",
        "a2v_reference",
        "context_latents",
        "context_audio",
        "audio_norm",
        "decoder_cache",
        "audio",
    }


def test_prompt_change_applies_from_next_chunk(tiny_modules, speech) -> None:
    pipeline = build_pipeline(tiny_config(), tiny_modules)
    audio = speech[: int(1.5 * RATE)]
    plain = render_batch(pipeline, audio).frames

    sink = CollectSink()
    session = pipeline.open_session(make_reference(), sinks=[sink])
    session.push_audio(audio)
    session.end_audio()
    session.step()  # N0 with no prompt
    session.set_prompt("a cheerful presenter, smiling")
    while session.step():
        pass
    session.close()
    assert np.array_equal(sink.frames[0], plain[0])  # N0 unchanged
    assert not np.array_equal(sink.frames[1], plain[1])  # the prompt applies from the next chunk


def test_bad_audio_and_reference_rejected(tiny_pipeline) -> None:
    with pytest.raises(InputError, match="reference must be"):
        tiny_pipeline.open_session(np.zeros((10, 10, 3), np.uint8))
    session = tiny_pipeline.open_session(make_reference())
    with pytest.raises(InputError, match="1-D float"):
        session.push_audio(np.zeros((2, 10), np.float32))
    with pytest.raises(InputError, match="NaN"):
        session.push_audio(np.array([np.nan], np.float32))
    session.end_audio()
    with pytest.raises(SessionClosedError):
        session.push_audio(np.zeros(10, np.float32))


def test_sink_error_aborts_every_sink(tiny_pipeline, speech) -> None:
    class Broken(CollectSink):
        def write(self, video, audio) -> None:
            raise OSError("disk full")

    good = CollectSink()
    session = tiny_pipeline.open_session(make_reference(), sinks=[good, Broken()])
    with pytest.raises(OSError, match="disk full"):
        session.render([speech[:RATE]])
    assert good.aborted and not good.closed


def test_released_audio_is_never_read_again(tiny_pipeline, speech) -> None:
    """The audio buffer stays bounded while frames are published."""
    sink = CollectSink()
    session = tiny_pipeline.open_session(make_reference(), sinks=[sink])
    sizes = []
    for block in blocks(np.resize(speech, 10 * RATE), 1600):
        session.push_audio(block)
        while session.step():
            sizes.append(session.state.audio.samples.shape[0])
    session.end_audio()
    while session.step():
        pass
    session.close()
    assert max(sizes) < RATE  # never more than a second waiting, for a 10 s input
    assert torch.is_tensor(session.state.fields["context_latents"])


def test_live_catch_up_skips_whole_chunks_when_far_behind(tiny_pipeline, speech) -> None:
    """With 3 s of audio already waiting, a live session skips chunks instead of lagging."""
    sink = CollectSink()
    session = tiny_pipeline.open_session(make_reference(), sinks=[sink])
    audio = np.resize(speech, 4 * RATE)
    session.push_audio(audio)
    session.end_audio()
    assert session.lag_seconds() > 3
    session.run_live(max_lag_s=0.5)
    shown = [
        i
        for first, f in zip(sink.first_indices, sink.frames, strict=True)
        for i in range(first, first + f.shape[0])
    ]
    total = frames_for_samples(audio.shape[0], 25, RATE)
    assert session.stats.skipped_frames > 0
    assert len(shown) + session.stats.skipped_frames == total  # every frame shown or skipped
    assert shown == sorted(shown) and len(set(shown)) == len(shown)
    assert shown[-1] == total - 1  # it caught up: the end of the audio was generated
    assert session.stats.chunk_seconds is not None and session.stats.chunk_seconds > 0


def test_a_rewind_waits_for_the_audio_of_the_chunk_it_goes_back_to(tiny_pipeline, speech) -> None:
    """``rewind`` with less audio than the chunk it goes back to needs (a reply still arriving):
    the session is not ready, makes nothing, and makes that chunk once the rest is pushed."""
    sink = CollectSink()
    session = tiny_pipeline.open_session(make_reference(), sinks=[sink])
    session.push_audio(np.resize(speech, 2 * RATE))
    while session.step():
        pass
    frame = session.rewind_points()[-2]  # a chunk made already: it is made again
    start = frame_start_sample(frame, 25, RATE)
    session.rewind(frame, speech[:320])  # 20 ms of the new audio, far short of a chunk
    assert session.state.audio.received == start + 320  # what came after it is dropped
    assert not session.ready()
    assert session.step() == 0
    assert session.made_until == frame  # it went back, and waits
    session.push_audio(np.resize(speech, RATE))
    assert session.ready()
    assert session.step() > 0 and sink.first_indices[-1] == frame
    session.close()


def test_no_chunk_is_skipped_while_a_rewind_to_the_first_frame_waits(tiny_pipeline, speech) -> None:
    """A reply that started early in the call's first chunk rewinds to frame 0: until the session
    has gone back, the chunk after it is not skipped (it is made again from the new audio)."""
    sink = CollectSink()
    session = tiny_pipeline.open_session(make_reference(), sinks=[sink])
    session.push_audio(np.resize(speech, RATE // 2))
    assert session.step() > 0 and session.rewind_points()[0] == 0
    session.rewind(0, np.resize(speech, 2 * RATE))
    assert session.lag_seconds() > 0.5 and session.ready()
    assert session.skip_chunk() == 0 and session.stats.skipped_frames == 0
    assert session.step() > 0 and sink.first_indices == [0, 0]  # the first chunk, made again
    session.close()

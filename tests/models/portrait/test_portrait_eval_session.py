"""`talkloop eval --family portrait` scores what ships: its parameters are the real Session's.

The evaluation (``models/portrait/evaluate.py``) runs the family's own Session with one change, a
publish stage that emits each frame's motion parameters instead of warping the photo. Here the
pipeline exactly as ``talkloop render`` / ``serve`` build it (``build_pipeline``: the
family's real stages and renderer, modules loaded separately) runs the same audio, prompt, seed
and shipped weights, and the parameters its renderer receives are compared with the evaluation's.
They must be bit-identical: both sides run the same stages over the same inputs in one process
on the same threads, so any difference (a stage, schedule, seed, sampler, window, context or
dtype that differs) is a divergence, not float noise. The renderer also adds the seeded blinks
(``blinks.py``), which the evaluation leaves out as it always did; the blink field is compared
with them added.
"""

from __future__ import annotations

import numpy as np
import pytest

from talkloop.pipeline.core.config import SamplerConfig, ScheduleConfig, build_config
from talkloop.pipeline.core.errors import PipelineError
from talkloop.pipeline.core.graph import Phase
from talkloop.pipeline.models import registry
from talkloop.pipeline.models.portrait import evaluate, family
from talkloop.pipeline.models.portrait.blinks import blink_track
from talkloop.pipeline.models.portrait.params import FRAME_FIELDS
from talkloop.pipeline.models.portrait.render import PortraitRenderer
from talkloop.pipeline.models.registry import build_pipeline

from support import feed_live

pytestmark = pytest.mark.unit  # ~40 s: the shipped (small) nets, seconds of speech, 1-clip eval

SHIPPED = family.INSTALLED_WEIGHTS
SEED = 3
PROMPT = "a bright smile, lively head"
BLINK = FRAME_FIELDS.index("blink")
SCHEDULES = {
    "offline": (evaluate.OFFLINE_SCHEDULE, evaluate.OFFLINE_SAMPLER),
    "live": (evaluate.LIVE_SCHEDULE, evaluate.LIVE_SAMPLER),
}


@pytest.fixture(scope="module")
def audio(speech) -> np.ndarray:
    return speech[: int(3.3 * 16000)]  # 83 frames: offline N0 + 3 N chunks (the last clipped)


@pytest.fixture(scope="module")
def runners() -> dict[str, evaluate.MotionRunner]:
    if not (SHIPPED / "a2v.safetensors").is_file():
        pytest.fail(f"no shipped portrait motion weights in {SHIPPED}")
    return {d: evaluate.load_runner(SHIPPED, seed=SEED, dtype=d) for d in ("float32", "bfloat16")}


@pytest.fixture(scope="module")
def runner(runners) -> evaluate.MotionRunner:
    return runners["float32"]


def shipped_params(
    schedule: ScheduleConfig,
    sampler: SamplerConfig,
    audio: np.ndarray,
    live: bool,
    dtype: str,
    monkeypatch,
) -> np.ndarray:
    """What the renderer of the pipeline `talkloop render`/`serve` builds receives, per frame.

    Live: audio pushed in 20 ms packets from another thread while ``run_live`` generates (as a
    call feeds it); offline: the whole file at once.
    """
    width, height = family.NATIVE_SIZES[0]
    config = build_config(
        video={"width": width, "height": height},
        schedule=schedule.model_dump(),
        sampler=sampler.model_dump(),
        model={"family": "portrait", "weights": SHIPPED, "dtype": dtype},
        seed=SEED,
    )
    pipeline = build_pipeline(config)
    got: list[np.ndarray] = []
    real_render = PortraitRenderer.render

    def spy(self, params):
        got.append(np.array(params, copy=True))
        return np.zeros((len(params), 2, 2, 3), np.uint8)  # pixels are not compared: skip them

    monkeypatch.setattr(PortraitRenderer, "render", spy)
    try:
        session = pipeline.open_session(registry.load_reference(config, None), PROMPT)
        if live:
            feed_live(session, audio)
        else:
            session.render([audio])
    finally:
        monkeypatch.setattr(PortraitRenderer, "render", real_render)
    return np.concatenate(got)


@pytest.mark.parametrize(
    ("plan", "dtype"), [("offline", "float32"), ("live", "float32"), ("offline", "bfloat16")]
)
def test_eval_parameters_are_the_shipped_sessions(plan, dtype, runners, audio, speech, monkeypatch):
    runner, (schedule, sampler) = runners[dtype], SCHEDULES[plan]
    assert evaluate.matmul_dtype(runner.modules["a2v"]) == dtype
    # A session with other audio and no prompt first: nothing may carry over between sessions
    # (the replayed reference stage, the cached pipeline).
    runner.generate(speech[16000 : 3 * 16000], "", schedule, sampler)
    gen = runner.generate(audio, PROMPT, schedule, sampler)
    ship = shipped_params(schedule, sampler, audio, plan == "live", dtype, monkeypatch)
    frames = len(ship)
    assert gen.params.shape == ship.shape == (frames, len(FRAME_FIELDS))
    assert frames == 83
    motion = [i for i in range(len(FRAME_FIELDS)) if i != BLINK]
    np.testing.assert_array_equal(gen.params[:, motion], ship[:, motion])
    blinks = blink_track(SEED, 0, frames, 25)
    np.testing.assert_array_equal(np.maximum(gen.params[:, BLINK], blinks), ship[:, BLINK])
    timeline = runner.pipeline(schedule, sampler).timeline
    assert gen.seams == [s.start for s in timeline.display_order(frames) if s.start > 0]
    assert gen.seams


def test_the_prompt_and_the_seed_reach_the_session(runner, audio) -> None:
    schedule, sampler = SCHEDULES["live"]
    base = runner.generate(audio, PROMPT, schedule, sampler)
    again = runner.generate(audio, PROMPT, schedule, sampler)
    np.testing.assert_array_equal(base.params, again.params)
    other_prompt = runner.generate(audio, "", schedule, sampler)
    assert not np.allclose(base.params, other_prompt.params)
    other_seed = evaluate.MotionRunner(
        runner.config.model_copy(update={"seed": SEED + 1}), runner.modules
    ).generate(audio, PROMPT, schedule, sampler)
    assert not np.allclose(base.params, other_seed.params)


def test_the_eval_refuses_a_publish_phase_it_does_not_know(runner, monkeypatch) -> None:
    real = registry.family_phases

    def extra_publish_stage(config):
        phases = dict(real(config))
        publish = phases["publish"]
        stages = [*publish.stages, evaluate.MotionParamsStage()]
        phases["publish"] = Phase("publish", publish.inputs, stages)
        return phases

    monkeypatch.setattr(registry, "family_phases", extra_publish_stage)
    with pytest.raises(PipelineError, match="PortraitRenderStage is the only publish stage"):
        evaluate.eval_phases(runner.config)


def test_evaluate_motion_scores_session_parameters(runner, tmp_path, monkeypatch) -> None:
    made = []  # (clip, prompt, schedule, generated) of every generation evaluate_motion runs
    real = evaluate._generate

    def spy(run, clip, prompt, schedule, sampler):
        made.append((clip, prompt, schedule, real(run, clip, prompt, schedule, sampler)))
        return made[-1][-1]

    monkeypatch.setattr(evaluate, "_generate", spy)
    result = evaluate.evaluate_motion(
        SHIPPED, tmp_path, clips=1, prompt_clips=1, seed=SEED, progress=False, dtype="float32"
    )
    assert result["dtype"] == "float32" and result["torch_threads"] == family.COMPUTE_THREADS
    assert (tmp_path / "eval.json").is_file() and (tmp_path / "eval.png").is_file()
    # (Clips are taken from what evaluate_motion made: espeak's audio for the same arguments
    # varies with what the process synthesised before, so a second make_clip may differ.)
    clip, prompt, _, live = next(m for m in made if m[2] == evaluate.LIVE_SCHEDULE)
    again = runner.generate(clip.audio, prompt, evaluate.LIVE_SCHEDULE, evaluate.LIVE_SAMPLER)
    np.testing.assert_array_equal(live.params, again.params)
    mo = evaluate.FIELD["mouth_open"]
    figures = evaluate.lipsync([live.params[:, mo]], [clip.params.values[:, mo]], 25, 40.0)
    assert result["lipsync_live"] == figures

"""Model families: the framework asks the family named by ``config.model.family`` and knows
nothing else about it. Each is a package with a ``SPEC`` (:mod:`talkloop.pipeline.models.spec`:
its name, sizes, block modules, live schedule, weights folder, trainer and evaluator) and a
``family.py`` that implements the contract below; a package under ``talkloop/pipeline/models/``
is found by itself, one elsewhere joins with ``spec.register``. Adding a family is its folder.

The contract (module-level names of the family's ``family.py``):

- ``load_modules(config) -> dict[str, Module]``: the family's networks, trained weights loaded
  (``config.model.weights`` or the installed folder) unless ``config.model.untrained``, finished
  with :func:`finish_modules` (the compute dtype and the placement);
- ``phases(config) -> dict[str, Phase]``: the stages of the init / prompt / n_chunk / i_chunk /
  publish phases (``talkloop/pipeline/core/graph.py`` checks the graph);
- ``load_reference(source, width, height) -> np.ndarray``: a path, an array or None (the
  family's default avatar) -> the ``(height, width, 3)`` uint8 image a session starts from;
- ``installed_weights() -> Path | None``: the weights folder shipped with the package, if there.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from talkloop.pipeline.backends.cache import weights_hash
from talkloop.pipeline.backends.export import RECIPE
from talkloop.pipeline.backends.select import resolve_backend, resolve_dtype, schedule_key
from talkloop.pipeline.core.config import ModelConfig, TalkloopConfig
from talkloop.pipeline.core.errors import CheckpointError, ConfigError, WeightsMissingError
from talkloop.pipeline.core.graph import Phase
from talkloop.pipeline.core.module import Module
from talkloop.pipeline.core.pipeline import Pipeline
from talkloop.pipeline.models.shared.a2v_graph import attach_a2v_graph
from talkloop.pipeline.models.sizes import warn_unless_native_size
from talkloop.pipeline.models.spec import DEFAULT_FAMILY, FamilySpec, get_spec
from talkloop.pipeline.offload.placement import apply_placement


def spec(name: str = DEFAULT_FAMILY) -> FamilySpec:
    """The spec of family ``name``. Raises ConfigError naming the known families."""
    try:
        return get_spec(name)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def family(name: str) -> ModuleType:
    """The ``family.py`` module of family ``name``."""
    return importlib.import_module(f"{spec(name).package}.family")


def load_modules(config: TalkloopConfig) -> dict[str, Module]:
    """Build the configured family's modules (see the module docstring)."""
    warn_unless_native_size(config)  # once: weights trained at 256 do not make a 512 face
    return family(config.model.family).load_modules(config)


def family_phases(config: TalkloopConfig) -> dict[str, Phase]:
    """The configured family's stages, per phase."""
    return family(config.model.family).phases(config)


def build_pipeline(
    config: TalkloopConfig,
    modules: Mapping[str, Module] | None = None,
    phases: Mapping[str, Phase] | None = None,
) -> Pipeline:
    """The configured family's pipeline: its modules (loaded when not given) and its phases
    (unless a caller replaces them)."""
    if modules is None:
        modules = load_modules(config)
    return Pipeline(config, modules, family_phases(config) if phases is None else phases)


def load_reference(
    config: TalkloopConfig, source: str | os.PathLike[str] | np.ndarray | None
) -> np.ndarray:
    """``source`` (a path, an array, or None for the family's default avatar) as the session's
    ``(height, width, 3)`` uint8 reference image. Bad images raise InputError."""
    v = config.video
    return family(config.model.family).load_reference(source, v.width, v.height)


def installed_weights(name: str) -> Path | None:
    """The weights folder shipped with family ``name``, if any."""
    return family(name).installed_weights()


# -- for the families' loaders ---------------------------------------------------------------------


def weights_folder(model: ModelConfig, name: str, installed: Path | None, expected: Path):
    """The checkpoint folder family ``name`` loads: ``model.weights``, else the installed one;
    None when ``model.untrained``. ``expected`` is the file an installed folder would have."""
    if model.untrained:
        return None
    folder = model.weights or installed
    if folder is None:
        raise WeightsMissingError(
            f"no trained weights are installed for the {name} model (expected {expected}). "
            "Pass --weights DIR to use a checkpoint folder, or --untrained to run with random "
            "weights (the video will not show a face)."
        )
    if not folder.is_dir():
        raise ConfigError(f"weights folder {folder} does not exist")
    return folder


def finish_modules(modules: dict[str, Module], config: TalkloopConfig) -> dict[str, Module]:
    """What every family does last: the compute dtype (``auto`` measured, see
    :func:`choose_dtype`), bf16 weights where bf16 computes, then the placement."""
    dtype = choose_dtype(modules, config)
    for module in modules.values():
        if dtype == "bfloat16":
            module.cast_matmuls(torch.bfloat16)
        module.compute_dtype = dtype
    apply_placement(modules, config.model)  # resident / offloaded / sharded
    return modules


# Part of dtype auto's cache key: bump when what the probe times changes.
DTYPE_PROBE = "session-chunks-v1"


def choose_dtype(modules: dict[str, Module], config: TalkloopConfig) -> str:
    """``model.dtype``, or for ``auto`` the faster of float32 and bfloat16 for this family here.

    The probe is the family's own work: the chunks of a session of ``config`` (its schedule
    and frame size) on the default avatar, its first chunk and two N chunks (the session's
    opening left out), run with the float32 modules and with a bf16 copy (:func:`talkloop.pipeline.backends.select.resolve_dtype` times them once
    per machine, weights and shapes, and caches the choice). With an exported backend
    (``onnxruntime``, ``openvino``) the hot networks are float32 graphs and ``auto`` is float32.

    Args:
        modules: the family's modules, loaded, in float32.
        config: the root config.
    """
    m = config.model
    if m.dtype != "auto":
        return m.dtype  # (no weights hash for a choice that is not measured)
    if m.backend not in ("auto", "torch"):
        return "float32"  # the exported graphs compute in float32 (decoder int8) whatever we pick
    weights = ",".join(f"{n}:{weights_hash(mod.net)}" for n, mod in sorted(modules.items()))
    identity = f"{m.family}:{weights}:{schedule_key(config)}:{DTYPE_PROBE}"
    return resolve_dtype(m.dtype, m.device, identity, lambda c: _dtype_probes(modules, config, c))


def _dtype_probes(
    modules: dict[str, Module], config: TalkloopConfig, candidates: tuple[str, ...]
) -> dict[str, Callable[[], object]]:
    reference = load_reference(config, None)
    s, fps = config.schedule, config.video.fps
    seconds = (s.first_len + 2 * s.n_len) / fps  # N0 and two N chunks
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(int(seconds * config.audio.sample_rate))).astype(np.float32)
    probes: dict[str, Callable[[], object]] = {}
    for dtype in candidates:
        mods = modules
        if dtype == "bfloat16":
            mods = {n: copy.deepcopy(mod) for n, mod in modules.items()}
            for mod in mods.values():
                mod.cast_matmuls(torch.bfloat16)
        cfg = config.model_copy(update={"model": config.model.model_copy(update={"dtype": dtype})})
        probes[dtype] = SessionProbe(build_pipeline(cfg, mods), reference, audio)
    return probes


# Part of the A2V backend choice's cache key: bump when what its probe times changes.
A2V_GRAPH_PROBE = "a2v-graph-v1"


def use_a2v_graph(
    modules: dict[str, Module],
    config: TalkloopConfig,
    float32: dict[str, torch.Tensor] | None,
    latent: tuple[int, int, int],
) -> str:
    """``model.backend`` for a family whose only exported network is its A2V: resolve it
    (``auto``: torch against each graph runtime on the chunks of a session of ``config``, timed
    once per machine and cached, as :func:`choose_dtype` times dtypes), then run the A2V as
    exported graphs (:mod:`talkloop.pipeline.models.shared.a2v_graph`) unless torch won.

    Args:
        modules: the family's modules, finished (:func:`finish_modules`).
        config: the root config.
        float32: the A2V's float32 state dict from before a bf16 cast, which the graphs are
            exported from (None: the net is float32).
        latent: one frame's A2V latent (C, h, w) in this family's sessions (the graphs' fixed
            dims; batch and frames are free).
    Returns:
        The backend the A2V now runs on.
    """
    m = config.model
    if m.backend == "torch" or (
        m.backend == "auto" and (m.device != "cpu" or m.placement.a2v != "resident")
    ):
        return "torch"
    tag = m.family

    def graph_modules(backend: str) -> dict[str, Module]:
        mods = dict(modules)
        a2v = copy.deepcopy(modules["a2v"])
        if float32 is not None:
            a2v.net.float().load_state_dict(float32)
        # The graphs compute in float32; compute_dtype stays what torch computes in (the other
        # modules), as with every exported backend: the runtime report says what the A2V runs.
        attach_a2v_graph(a2v.net, backend, tag)
        mods["a2v"] = a2v
        return mods

    def probes(candidates: tuple[str, ...]) -> dict[str, Callable[[], object]]:
        reference = load_reference(config, None)
        s = config.schedule
        seconds = (s.first_len + 2 * s.n_len) / config.video.fps  # N0 and two N chunks
        rng = np.random.default_rng(0)
        audio = 0.1 * rng.standard_normal(int(seconds * config.audio.sample_rate))
        out: dict[str, Callable[[], object]] = {}
        for name in candidates:
            mods = modules if name == "torch" else graph_modules(name)
            out[name] = SessionProbe(build_pipeline(config, mods), reference, audio.astype("f4"))
        return out

    weights = weights_hash(modules["a2v"].net)
    identity = f"{m.family}:{weights}:{schedule_key(config)}:{RECIPE}:{A2V_GRAPH_PROBE}"
    backend = resolve_backend(m.backend, m.device, identity, probes)
    if backend != "torch":
        a2v = graph_modules(backend)["a2v"]
        s = config.schedule
        sm = config.sampler
        steps = (sm.steps, sm.i_steps) if s.i_len else (sm.steps,)
        a2v.net.forward.warm_up(s.ctx_len + s.n_len, latent, steps, sm.shift, sm.audio_guidance)
        modules["a2v"] = a2v
    return backend


class SessionProbe:
    """One probe: a session of ``pipeline`` with no sinks, given all of ``audio`` at once; the
    seconds its chunks took (opening it, the reference and the prompt, are left out: they run
    once a session, the chunks all along)."""

    def __init__(self, pipeline: Pipeline, reference: np.ndarray, audio: np.ndarray) -> None:
        self.pipeline, self.reference, self.audio = pipeline, reference, audio

    def __call__(self) -> float:
        session = self.pipeline.open_session(self.reference, "", (), seed=0)
        try:
            session.push_audio(self.audio)
            session.end_audio()
            t0 = time.perf_counter()
            while session.step():
                pass
            return time.perf_counter() - t0
        finally:
            session.close()


def module_config(folder: Path, name: str) -> dict:
    """The JSON config module ``name`` was saved with in checkpoint ``folder``."""
    path = folder / f"{name}.json"
    if not path.is_file():
        raise CheckpointError(f"checkpoint folder {folder} has no {path.name}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from None

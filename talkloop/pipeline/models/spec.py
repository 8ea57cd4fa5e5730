"""The model families a process knows: one :class:`FamilySpec` each, and the default family.

A family is a package whose ``__init__.py`` defines ``SPEC``, a :class:`FamilySpec` (plain data,
no heavy imports, so that validating a config or building the command line loads no network),
and whose ``family.py`` implements the contract of :mod:`talkloop.pipeline.models.registry`.
Every package under ``talkloop/pipeline/models/`` with a ``SPEC`` is found by itself; a family
that lives elsewhere joins with :func:`register`. Everything that lists or checks families (the
CLI's choices, config validation, batch manifests, train and eval) asks here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

DEFAULT_FAMILY = "portrait"


@dataclass(frozen=True)
class SizeRule:
    """The frame sizes a family can make: a multiple of ``step`` from ``low`` to ``high``."""

    step: int
    low: int
    high: int

    def check(self, side: int) -> str | None:
        """None if ``side`` suits the rule, else what is wrong with it."""
        if side % self.step or not self.low <= side <= self.high:
            return f"use a multiple of {self.step} between {self.low} and {self.high}"
        return None


@dataclass(frozen=True)
class StateField:
    """A field a family's stages keep in a session's state from one chunk to the next.

    ``starts_empty``: None is a valid value before any stage wrote it (the start of the stream);
    otherwise a stage of the ``init`` phase must write it before any other phase reads it.
    """

    name: str
    about: str
    starts_empty: bool = False


@dataclass(frozen=True)
class FamilySpec:
    """What the framework knows of a family without loading it.

    Args:
        name: ``model.family`` / ``--family``.
        package: the importable package holding ``family.py``.
        summary: one line for ``--help``.
        size_rule: the frame sizes it can make.
        native_sizes: the (width, height) sizes its shipped weights were made for; the first is
            its default size.
        block_modules: modules with transformer blocks (a ``.blocks`` ModuleList): only these
            can be offloaded or sharded per block.
        state_fields: what its own stages keep between chunks, beyond the fields every family's
            chunk stages share (``talkloop.pipeline.core.state.SHARED_FIELDS``).
        live_schedule: chunk schedule overrides of live calls (``ScheduleConfig`` fields).
        sampler: sampler settings of every render and call of the family (``SamplerConfig``
            fields), under what the command line sets.
        live_sampler: sampler overrides of live calls (``SamplerConfig`` fields), over
            ``sampler``.
        weights: the folder its shipped weights are in (absent in a stripped install: the
            family's ``installed_weights()`` says whether they are there).
        backends: what can run its hot networks (``--backend``): torch, and the graph
            runtimes it exports to (``onnxruntime``, ``openvino``).
        cli_args: ``module:function(command, group)`` adding the family's own options of
            ``talkloop train`` / ``talkloop eval`` (``command``) to an argument group; given
            with another ``--family`` they are refused.
        trainer: ``module:function`` of ``talkloop train --family NAME`` (None: not trainable).
        evaluator: ``module:function`` of ``talkloop eval --family NAME`` (None: no evaluation).
        publish_per_frame: its ``publish`` phase makes each frame from that frame's latents
            alone, carrying nothing from one frame to the next (the same frames whether a
            chunk is published whole or frame by frame): the live engine then publishes a
            batch of calls' chunks in waves, every chunk's first frame before any second one.
    """

    name: str
    package: str
    summary: str
    size_rule: SizeRule
    native_sizes: tuple[tuple[int, int], ...]
    block_modules: tuple[str, ...] = ()
    state_fields: tuple[StateField, ...] = ()
    live_schedule: Mapping[str, int] = field(default_factory=dict)
    sampler: Mapping[str, float] = field(default_factory=dict)
    live_sampler: Mapping[str, float] = field(default_factory=dict)
    weights: Path | None = None
    backends: tuple[str, ...] = ("torch",)
    cli_args: str | None = None
    trainer: str | None = None
    evaluator: str | None = None
    publish_per_frame: bool = False


_SPECS: dict[str, FamilySpec] = {}
_found = False


def _discover() -> None:
    global _found
    if _found:
        return
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.ispkg:
            spec = getattr(importlib.import_module(f"{__package__}.{info.name}"), "SPEC", None)
            if isinstance(spec, FamilySpec):
                _SPECS.setdefault(spec.name, spec)
    _found = True


def register(spec: FamilySpec) -> None:
    """Make the family ``spec`` describes known to this process (a package outside this one)."""
    _discover()
    if spec.name in _SPECS and _SPECS[spec.name] != spec:
        raise ValueError(f"a model family named {spec.name!r} is already registered")
    _SPECS[spec.name] = spec


def unregister(name: str) -> None:
    """Forget a family added by :func:`register` (tests)."""
    _SPECS.pop(name, None)


def family_names() -> tuple[str, ...]:
    """The known families, the default first."""
    _discover()
    return tuple(sorted(_SPECS, key=lambda n: (n != DEFAULT_FAMILY, n)))


def specs() -> Mapping[str, FamilySpec]:
    _discover()
    return MappingProxyType(_SPECS)


def get_spec(name: str) -> FamilySpec:
    """The spec of family ``name``. Raises ValueError naming the known ones."""
    _discover()
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(
            f"unknown model family {name!r}: use one of {', '.join(family_names())}"
        ) from None

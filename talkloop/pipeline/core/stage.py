"""Stage: a typed unit of work that declares what it reads, writes and needs.

A stage reads and writes named fields through a ``StageContext``. The pipeline checks the
declarations when it is built (a field nobody produces, a module nobody loaded) and the context
enforces them while running, so a stage cannot quietly depend on something it did not declare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from talkloop.pipeline.core.errors import PipelineError
from talkloop.pipeline.core.module import Module


class Stage:
    """Base class. Subclasses set the four class attributes and implement ``run``.

    Attributes:
        name: shown in errors and logs.
        reads: fields the stage reads (chunk fields or session fields).
        writes: fields the stage writes.
        needs: module names the stage uses.
    """

    name: ClassVar[str] = "stage"
    reads: ClassVar[tuple[str, ...]] = ()
    writes: ClassVar[tuple[str, ...]] = ()
    needs: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: StageContext) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def run_batch(self, ctxs: Sequence[StageContext]) -> None:
        """Run for several sessions' chunks at once (the live engine batches calls). The base
        class runs them one by one; a stage whose network gains from a batch overrides this and
        must write exactly what ``run`` would have written for each."""
        for ctx in ctxs:
            self.run(ctx)


class StageContext:
    """The fields one stage may touch, backed by a chunk's working fields and the session state.

    Session fields (those the session state declares) are read from and written to the state;
    everything else lives in ``work``, which the pipeline drops once the chunk is published.
    """

    def __init__(
        self,
        stage: Stage,
        work: dict[str, Any],
        session: Any,
        modules: Mapping[str, Module],
        session_fields: frozenset[str],
    ) -> None:
        self._stage = stage
        self._work = work
        self._session = session
        self._modules = modules
        self._session_fields = session_fields

    def read(self, field: str) -> Any:
        if field not in self._stage.reads:
            raise PipelineError(f"stage {self._stage.name!r} reads {field!r} without declaring it")
        if field in self._session_fields:
            return self._session.fields[field]
        try:
            return self._work[field]
        except KeyError:
            raise PipelineError(
                f"stage {self._stage.name!r} reads {field!r}, which has not been written yet"
            ) from None

    def write(self, field: str, value: Any) -> None:
        if field not in self._stage.writes:
            raise PipelineError(f"stage {self._stage.name!r} writes {field!r} without declaring it")
        if field in self._session_fields:
            self._session.fields[field] = value
        else:
            self._work[field] = value

    def module(self, name: str) -> Module:
        if name not in self._stage.needs:
            raise PipelineError(
                f"stage {self._stage.name!r} uses module {name!r} without declaring it"
            )
        return self._modules[name]

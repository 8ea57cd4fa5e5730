"""The chunk timeline: N chunks tile the video, I chunks smooth each seam (docs/architecture.md).

Execution order is ``N0, N1, I0, N2, I1, ...``: I(k) runs once N(k) and N(k+1) exist. I(k) redoes
the first ``i`` frames of N(k+1), anchored on the last frame of N(k) and on frame ``i`` of N(k+1);
its predictions at the anchor positions are discarded. Display order is therefore
``N0 | I0 interior, N1[i:] | I1 interior, N2[i:] | ...`` where ``i = min(i_len, len(N(k+1)) - 1)``
(a final chunk shorter than ``i_len + 1`` frames gets a shorter interior).

Everything here is arithmetic on frame indices; no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from talkloop.pipeline.core.config import ScheduleConfig


@dataclass(frozen=True)
class NChunk:
    """N chunk ``index``: generates display frames ``[start, stop)``."""

    index: int
    start: int
    stop: int

    kind: Literal["N"] = "N"

    @property
    def length(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class IChunk:
    """I chunk ``index``: regenerates frames ``[start, stop)``, the first frames of N(index + 1).

    Its sequence is ``[anchor start - 1 (last frame of N(index)), interior..., anchor stop]``.
    """

    index: int
    start: int
    stop: int

    kind: Literal["I"] = "I"

    @property
    def length(self) -> int:
        return self.stop - self.start

    @property
    def anchors(self) -> tuple[int, int]:
        return self.start - 1, self.stop


@dataclass(frozen=True)
class Segment:
    """Display frames ``[start, stop)`` taken from chunk ``source`` (an NChunk or IChunk)."""

    source: NChunk | IChunk
    start: int
    stop: int


class Timeline:
    """Chunk arithmetic for one config. ``total_frames=None`` means the stream has not ended."""

    def __init__(self, config: ScheduleConfig) -> None:
        self.config = config

    def n_start(self, k: int) -> int:
        c = self.config
        return 0 if k == 0 else c.first_len + (k - 1) * c.n_len

    def n_chunk(self, k: int, total_frames: int | None = None) -> NChunk | None:
        """N(k), clipped to ``total_frames``; None if it would start past the end."""
        c = self.config
        start = self.n_start(k)
        stop = start + (c.first_len if k == 0 else c.n_len)
        if total_frames is not None:
            if start >= total_frames:
                return None
            stop = min(stop, total_frames)
        return NChunk(k, start, stop)

    def i_chunk(self, next_n: NChunk) -> IChunk | None:
        """The I chunk between N(k) and ``next_n`` = N(k+1); None when there is nothing to redo."""
        if next_n.index == 0:
            raise ValueError("N0 has no I chunk before it")
        interior = min(self.config.i_len, next_n.length - 1)
        if interior <= 0:
            return None
        return IChunk(next_n.index - 1, next_n.start, next_n.start + interior)

    def segments_after(self, n: NChunk) -> list[Segment]:
        """What is published once ``n`` (and the I chunk before it) has been generated."""
        if n.index == 0:
            return [Segment(n, n.start, n.stop)]
        i = self.i_chunk(n)
        if i is None:
            return [Segment(n, n.start, n.stop)]
        return [Segment(i, i.start, i.stop), Segment(n, i.stop, n.stop)]

    # -- whole-timeline views (tests, batch planning) ---------------------------------------------

    def n_chunks(self, total_frames: int) -> list[NChunk]:
        chunks: list[NChunk] = []
        while (n := self.n_chunk(len(chunks), total_frames)) is not None:
            chunks.append(n)
        return chunks

    def execution_order(self, total_frames: int) -> list[NChunk | IChunk]:
        order: list[NChunk | IChunk] = []
        for n in self.n_chunks(total_frames):
            order.append(n)
            if n.index > 0 and (i := self.i_chunk(n)) is not None:
                order.append(i)
        return order

    def display_order(self, total_frames: int) -> list[Segment]:
        segments: list[Segment] = []
        for n in self.n_chunks(total_frames):
            segments.extend(self.segments_after(n))
        return segments

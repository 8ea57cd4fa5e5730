"""`talkloop render-batch`: every manifest row rendered as one Ray task, across the cluster.

Each row is a task needing one CPU and ``memory_mb`` of memory (Ray places it on a node with both
free and never runs more there than fit). A row whose render fails (unreadable audio, a bad photo)
is reported with its error and the others go on; a row whose worker process or node is lost is
run once more (``max_retries=1``; application errors are never retried: the same input would fail
the same way). Rows whose mp4 already exists are skipped: ``Mp4Sink`` writes under a temporary
name and renames onto the final path only when the file is complete, so a file there is a finished
render, and a rerun after a crash or Ctrl-C does only what is missing.

Paths travel as strings: every node must see the manifest's files and the output folder at the
same paths (a shared volume; docs/scaling.md).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from talkloop.pipeline.cluster.connect import import_ray
from talkloop.pipeline.cluster.manifest import Row
from talkloop.pipeline.console import progress_bar
from talkloop.pipeline.core.config import build_config
from talkloop.pipeline.models.registry import build_pipeline
from talkloop.pipeline.render import render_file

TASK_MEMORY_MB = 3000  # a render's peak with room for the encoder and torch (docs/scaling.md)
SUMMARY = "summary.json"


@dataclass(frozen=True)
class Job:
    """What one task needs: plain values, so it pickles small."""

    number: int
    config: dict  # TalkloopConfig.model_dump(mode="json")
    audio: str
    out: str
    reference: str | None
    prompt: str


@dataclass
class RowResult:
    """One row's line in summary.json."""

    row: int
    audio: str
    output: str
    status: str  # "ok", "failed" or "skipped" (its mp4 was complete already)
    error: str | None = None
    seconds: float = 0.0  # wall time of the task, model load included
    media_seconds: float = 0.0
    node: str | None = None  # the Ray node id that rendered it


_PIPELINE: tuple[str, object] | None = None  # (config key, Pipeline): reused by the next row


def _pipeline(config):
    """The worker process's pipeline for ``config``: Ray reuses a worker for the next task, so
    consecutive rows of one family load their networks once. Only one is kept (bounded memory)."""
    global _PIPELINE

    key = json.dumps(config.model_dump(mode="json"), sort_keys=True)
    if _PIPELINE is None or _PIPELINE[0] != key:
        _PIPELINE = None  # free the previous one before loading
        _PIPELINE = (key, build_pipeline(config))
    return _PIPELINE[1]


def render_row(job: Job) -> RowResult:
    """Render one row (runs inside a Ray task). Errors of the row become its result."""
    import ray

    t0 = time.perf_counter()
    node = ray.get_runtime_context().get_node_id()
    result = RowResult(job.number, job.audio, job.out, "ok", node=node)
    try:
        config = build_config(**job.config)
        rendered = render_file(
            config, job.audio, job.out, job.reference, job.prompt, pipeline=_pipeline(config)
        )
        result.media_seconds = round(rendered.media_seconds, 3)
    except Exception as err:  # this row only: the batch goes on
        result.status = "failed"
        result.error = str(err) or type(err).__name__
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


@dataclass
class BatchSummary:
    rows: list[RowResult]
    wall_seconds: float
    interrupted: bool = False  # Ctrl-C: the rows not yet done are missing from ``rows``

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.rows) for s in ("ok", "failed", "skipped")}

    def to_json(self) -> dict:
        rendered = sum(r.media_seconds for r in self.rows if r.status == "ok")
        return {
            **self.counts(),
            "rows": [asdict(r) for r in self.rows],
            "wall_seconds": round(self.wall_seconds, 3),
            "media_seconds": round(rendered, 3),
            "media_seconds_per_wall_second": round(rendered / max(self.wall_seconds, 1e-9), 3),
            "nodes": sorted({r.node for r in self.rows if r.node}),
            "interrupted": self.interrupted,
        }


def write_summary(folder: Path, summary: BatchSummary) -> Path:
    """``folder/summary.json``, replaced atomically (a reader never sees half of it)."""
    path = folder / SUMMARY
    temp = folder / f".{SUMMARY}.tmp"
    temp.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    os.replace(temp, path)
    return path


def run_batch(
    rows: list[Row],
    folder: Path,
    config_for: Callable[[str | None], dict],
    *,
    memory_mb: int = TASK_MEMORY_MB,
    progress: bool = True,
    report: Callable[[str], None] | None = None,
) -> BatchSummary:
    """Render ``rows`` into ``folder`` as Ray tasks on the cluster this process joined.

    Args:
        rows: the manifest's rows.
        folder: output folder (exists); each row writes ``folder/<out>.mp4``.
        config_for: the config dict (``model_dump(mode="json")``) of a row's family (None: the
            batch's own).
        memory_mb: memory each task reserves on its node.
        progress: one progress bar over the rows.
        report: where failed rows are told as they fail, one line each (default: stderr,
            above the progress bar).

    Returns:
        Every row's result, in manifest order.
    """
    ray = import_ray()
    task = ray.remote(render_row).options(
        num_cpus=1,
        memory=memory_mb * 1024 * 1024,
        max_retries=1,  # worker or node lost: once more, elsewhere if need be
        retry_exceptions=False,  # errors of the row itself are results, never retried
    )
    t0 = time.perf_counter()
    results: dict[int, RowResult] = {}
    refs = {}
    for row in rows:
        mp4 = row.mp4(folder)
        if mp4.is_file():
            results[row.number] = RowResult(row.number, str(row.audio), str(mp4), "skipped")
            continue
        job = Job(
            row.number,
            config_for(row.family),
            str(row.audio),
            str(mp4),
            str(row.reference) if row.reference else None,
            row.prompt,
        )
        refs[task.remote(job)] = row
    bar = progress_bar(total=len(rows), unit="row", enabled=progress, dynamic_ncols=True)
    bar.update(len(results))
    pending = list(refs)
    interrupted = False
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                row = refs[ref]
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayError as err:  # lost twice, or killed for memory
                    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                    res = RowResult(
                        row.number,
                        str(row.audio),
                        str(row.mp4(folder)),
                        "failed",
                        f"worker lost: {type(err).__name__}: {first}",
                    )
                results[row.number] = res
                if res.status == "failed":
                    line = f"talkloop: row {row.number} ({row.audio.name}) failed: {res.error}"
                    if report is not None:
                        report(line)
                    else:
                        tqdm.write(line, file=sys.stderr)
                bar.update(1)
                c = {s: sum(r.status == s for r in results.values()) for s in ("ok", "failed")}
                bar.set_postfix(ok=c["ok"], failed=c["failed"])
    except KeyboardInterrupt:  # Ctrl-C: stop the rest; the summary says what was done
        interrupted = True
        for ref in pending:
            ray.cancel(ref, force=True)
    finally:
        bar.close()
    ordered = [results[r.number] for r in rows if r.number in results]
    return BatchSummary(ordered, time.perf_counter() - t0, interrupted)

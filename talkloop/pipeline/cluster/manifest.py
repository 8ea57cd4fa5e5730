"""The manifest of `talkloop render-batch`: one row per render, as CSV (header row) or JSONL.

Columns: ``audio`` (required), ``reference``, ``prompt``, ``family``, ``out`` (the output file's
stem; default the audio file's stem). Relative paths resolve against the manifest's folder. A bad
manifest (no ``audio`` column, an unknown column, no rows, two rows writing one file) is refused
as a whole with one ``ManifestError`` line, before anything is rendered; a bad *file* named by a
row (unreadable audio) fails that row only, when it runs.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.models.spec import family_names

COLUMNS = ("audio", "reference", "prompt", "family", "out")


class ManifestError(ConfigError):
    """The manifest cannot be read as a whole (not one of its rows' files)."""


@dataclass(frozen=True)
class Row:
    """One render of the batch. ``number`` counts data rows from 1 (the CSV header is not one)."""

    number: int
    audio: Path
    out: str
    reference: Path | None = None
    prompt: str = ""
    family: str | None = None  # None: the batch's --family

    def mp4(self, folder: Path) -> Path:
        return folder / f"{self.out}.mp4"


def read_manifest(path: str | Path) -> list[Row]:
    """The rows of a ``.csv`` or ``.jsonl`` manifest.

    Raises:
        ManifestError: missing or unreadable file, unknown format, no ``audio`` column, an
            unknown column, a row without audio, an unknown family, no rows, a duplicate ``out``.
    """
    p = Path(path)
    if not p.is_file():
        raise ManifestError(f"manifest not found: {p}")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise ManifestError(f"cannot read manifest {p}: {err}") from None
    kind = p.suffix.lower()
    if kind == ".csv":
        records = _csv_records(text, p)
    elif kind in (".jsonl", ".ndjson"):
        records = _jsonl_records(text, p)
    else:
        raise ManifestError(f"manifest must be a .csv (with a header row) or .jsonl file, got {p}")
    if not records:
        raise ManifestError(f"manifest {p} has no rows: nothing to render")
    rows = [_row(n, rec, p) for n, rec in enumerate(records, 1)]
    seen: dict[str, int] = {}
    for row in rows:
        if row.out in seen:
            raise ManifestError(
                f"manifest {p}: rows {seen[row.out]} and {row.number} both write {row.out}.mp4; "
                "give one of them another 'out'"
            )
        seen[row.out] = row.number
    return rows


def _check_columns(columns: list[str], where: str) -> None:
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise ManifestError(
            f"{where}: unknown column {unknown[0]!r} (columns: audio (required), "
            f"{', '.join(COLUMNS[1:])})"
        )
    if "audio" not in columns:
        raise ManifestError(f"{where}: no 'audio' column (it names each row's driving audio)")


def _csv_records(text: str, p: Path) -> list[dict[str, str]]:
    reader = csv.DictReader(text.splitlines())
    header = [c.strip() for c in (reader.fieldnames or [])]
    if not header:
        raise ManifestError(f"manifest {p} is empty: it needs a header row with an 'audio' column")
    _check_columns(header, f"manifest {p}")
    reader.fieldnames = header
    records = []
    for rec in reader:
        if None in rec:  # more cells than header columns
            raise ManifestError(f"manifest {p}, line {reader.line_num}: more cells than columns")
        values = {k: (v or "").strip() for k, v in rec.items()}
        if any(values.values()):  # blank lines are not rows
            records.append(values)
    return records


def _jsonl_records(text: str, p: Path) -> list[dict[str, str]]:
    records = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"manifest {p}, line {line_no}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ManifestError(f"{where}: not JSON ({err.msg})") from None
        if not isinstance(rec, dict):
            raise ManifestError(
                f"{where}: each line must be a JSON object, got {type(rec).__name__}"
            )
        _check_columns(list(rec), where)
        bad = [k for k, v in rec.items() if v is not None and not isinstance(v, str)]
        if bad:
            raise ManifestError(f"{where}: {bad[0]!r} must be a string")
        records.append({k: (v or "").strip() for k, v in rec.items()})
    return records


def _row(number: int, rec: dict[str, str], manifest: Path) -> Row:
    base = manifest.resolve().parent
    where = f"manifest {manifest}, row {number}"
    if not rec.get("audio"):
        raise ManifestError(f"{where}: empty 'audio'")
    audio = base / rec["audio"]
    family = rec.get("family") or None
    if family is not None and family not in family_names():
        raise ManifestError(f"{where}: family {family!r} is not one of {', '.join(family_names())}")
    out = rec.get("out") or Path(rec["audio"]).stem
    if Path(out).name != out or out in (".", ".."):
        raise ManifestError(f"{where}: 'out' is a file stem, not a path, got {out!r}")
    reference = base / rec["reference"] if rec.get("reference") else None
    return Row(number, audio, out, reference, rec.get("prompt", ""), family)

"""render-batch manifests: CSV and JSONL rows resolve against the manifest's folder; a bad
manifest is refused as a whole with exit 2 and one line, before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from talkloop.pipeline.cli import main
from talkloop.pipeline.cluster.manifest import read_manifest

pytestmark = pytest.mark.unit


def test_csv_rows_resolve_against_the_manifest_folder(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text(
        "audio,reference,prompt,family,out\n"
        "clips/a.wav,faces/p.png,calm,studio,\n"
        "\n"
        "/abs/b.mp3,,,,bee\n"
    )
    rows = read_manifest(tmp_path / "m.csv")
    assert [r.number for r in rows] == [1, 2]
    assert rows[0].audio == tmp_path / "clips" / "a.wav"
    assert rows[0].reference == tmp_path / "faces" / "p.png"
    assert (rows[0].prompt, rows[0].family, rows[0].out) == ("calm", "studio", "a")
    assert rows[1].audio == Path("/abs/b.mp3")
    assert (rows[1].reference, rows[1].family, rows[1].out) == (None, None, "bee")
    assert rows[1].mp4(tmp_path) == tmp_path / "bee.mp4"


def test_jsonl_rows_take_the_same_keys(tmp_path: Path) -> None:
    (tmp_path / "m.jsonl").write_text(
        '{"audio": "a.wav", "prompt": "smiles"}\n\n{"audio": "b.wav", "out": "x", "family": null}\n'
    )
    rows = read_manifest(tmp_path / "m.jsonl")
    assert [(r.audio.name, r.out, r.prompt, r.family) for r in rows] == [
        ("a.wav", "a", "smiles", None),
        ("b.wav", "x", "", None),
    ]


BAD = [
    ("no_audio.csv", "reference,out\np.png,x\n", "no 'audio' column"),
    ("unknown.csv", "audio,voice\na.wav,alto\n", "unknown column 'voice'"),
    ("empty.csv", "", "is empty"),
    ("header_only.csv", "audio,out\n", "has no rows"),
    ("dup.csv", "audio,out\na.wav,x\nb.wav,x\n", "rows 1 and 2 both write x.mp4"),
    ("family.csv", "audio,family\na.wav,cartoon\n", "family 'cartoon'"),
    ("path_out.csv", "audio,out\na.wav,../x\n", "a file stem, not a path"),
    ("unknown.jsonl", '{"audio": "a.wav", "speed": "2"}\n', "unknown column 'speed'"),
    ("broken.jsonl", '{"audio": \n', "not JSON"),
    ("notes.txt", "audio\na.wav\n", "must be a .csv"),
]


@pytest.mark.parametrize(("name", "text", "says"), BAD, ids=[b[0] for b in BAD])
def test_bad_manifest_exits_2_with_one_line(tmp_path: Path, capsys, name, text, says) -> None:
    (tmp_path / name).write_text(text)
    code = main(["render-batch", str(tmp_path / name), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert says in err
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_missing_manifest_exits_2(tmp_path: Path, capsys) -> None:
    code = main(["render-batch", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o")])
    assert code == 2
    assert "manifest not found" in capsys.readouterr().err

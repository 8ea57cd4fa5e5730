"""Regenerate the voices in this folder: Debian's flite and festival, not espeak.

Each voice says each set of two sentences in ``TEXTS``, 0.6 s apart, 0.4 s of silence before and
after: ``bilabial`` (full of p, b and m, for the lip closures; files ``NAME.*``) and ``harvard``
(two Harvard sentences, a typical mix of sounds, for the opening in speech; files
``NAME_harvard.*``). Mono 16 kHz Ogg Opus at 32 kbit/s (``STEM.ogg``: a fifth of FLAC's size,
same timing), with its transcript (``STEM.txt``) and the synthesiser's own phone times
(``STEM.lab``: ``start<TAB>end<TAB>phone`` in seconds, ARPAbet as flite and festival write it;
pauses left out). Needs ``apt-get install flite festival festvox-kallpc16k festvox-us-slt-hts``.
Run from the repository root: ``.venv/bin/python tests/data/voices/make_voices.py`` (everything),
``... --texts harvard`` (one set), ``... flite_slt`` (one voice). See SOURCES.md.

Recorded human speech, in the same form (``librivox_*``): ``... --librivox TARBALL`` takes the
LibriVox clips that pocketsphinx's source package (``pocketsphinx-5.1.1.tar.gz`` from PyPI, its
sha256 checked) ships with their forced-aligned phone times, two utterances a file where they
follow each other in the book.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

import av
import numpy as np

from talkloop.pipeline.audio.festival import festival_say
from talkloop.pipeline.audio.io import load_audio

HERE = Path(__file__).parent
RATE = 16000
# set name -> (file-stem suffix, sentences)
TEXTS = {
    "bilabial": ("", ("Bob makes maps by the bay.", "My mom picked plums.")),
    # IEEE (1969) "Harvard" list 1, sentences 1 and 2 (public domain)
    "harvard": (
        "_harvard",
        (
            "The birch canoe slid on the smooth planks.",
            "Glue the sheet to the dark blue background.",
        ),
    ),
}
GAP_S, EDGE_S = 0.6, 0.4
BITRATE = 32000
# file stem -> (synthesiser, voice)
VOICES = {
    "flite_slt": ("flite", "slt"),
    "flite_rms": ("flite", "rms"),
    "flite_awb": ("flite", "awb"),
    "festival_kal": ("festival", "kal_diphone"),
    "festival_slt_hts": ("festival", "cmu_us_slt_arctic_hts"),
}


def _flite(voice: str, text: str, wav: Path) -> list[tuple[float, str]]:
    out = subprocess.run(
        ["flite", "-voice", voice, "-psdur", "-t", text, "-o", str(wav)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [(float(t), p) for p, t in re.findall(r"(\S+):([0-9.]+)", out)]


def make(stem: str, synth: str, voice: str, sentences: tuple[str, ...]) -> None:
    utterances = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, text in enumerate(sentences):
            wav = Path(tmp) / f"{k}.wav"
            # festival_say refuses a voice that is not installed (Festival would use its default)
            ends = _flite(voice, text, wav) if synth == "flite" else festival_say(text, voice, wav)
            phones, start = [], 0.0
            for end, phone in ends:
                if phone not in ("pau", "h#", "#"):
                    phones.append((start, end, phone))
                start = end
            utterances.append((load_audio(wav, RATE), phones))
    write(stem, utterances, " ".join(sentences))


# pocketsphinx 5.1.1's source package on PyPI; its test/data/librivox holds five utterances of
# LibriVox's "Sense and Sensibility", chapter 1 (16 kHz mono WAV, each with the aligner's phones).
POCKETSPHINX_SHA256 = "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355"
LIBRIVOX = "pocketsphinx-5.1.1/test/data/librivox/sense_and_sensibility_01_austen_64kb-{}"
# file stem -> the utterances it holds (consecutive in the book)
LIBRIVOX_CLIPS = {
    "librivox_0870": ("0870",),
    "librivox_0880": ("0880", "0890"),
    "librivox_0920": ("0920", "0930"),
}


def make_librivox(tarball: Path) -> None:
    if hashlib.sha256(tarball.read_bytes()).hexdigest() != POCKETSPHINX_SHA256:
        raise SystemExit(f"{tarball} is not pocketsphinx-5.1.1.tar.gz from PyPI (sha256)")
    with tarfile.open(tarball) as tar, tempfile.TemporaryDirectory() as tmp:
        for stem, ids in LIBRIVOX_CLIPS.items():
            utterances, texts = [], []
            for i in ids:
                name = LIBRIVOX.format(i)
                tar.extract(f"{name}.wav", tmp, filter="data")
                aligned = json.load(tar.extractfile(f"{name}.phone.json"))
                phones = [
                    (p["b"], p["b"] + p["d"], p["t"])
                    for word in aligned["w"]
                    for p in word["w"]
                    if p["t"] != "SIL" and not p["t"].startswith("+")
                ]
                utterances.append((load_audio(Path(tmp) / f"{name}.wav", RATE), phones))
                texts.append(aligned["t"].strip() + ".")
            write(stem, utterances, " ".join(t[0].upper() + t[1:] for t in texts))


def write(stem: str, utterances: list[tuple[np.ndarray, list]], text: str) -> None:
    """``STEM.ogg``, ``.txt`` and ``.lab``: the utterances (float audio at ``RATE``, phones as
    ``(start, end, label)`` in its seconds) ``GAP_S`` apart, ``EDGE_S`` of silence around."""
    pieces = [np.zeros(int(EDGE_S * RATE), np.float32)]
    labels: list[tuple[float, float, str]] = []
    for k, (audio, phones) in enumerate(utterances):
        t0 = sum(len(p) for p in pieces) / RATE
        labels += [(t0 + a, t0 + b, phone) for a, b, phone in phones]
        last = k == len(utterances) - 1
        pieces += [audio, np.zeros(int((EDGE_S if last else GAP_S) * RATE), np.float32)]
    samples = np.concatenate(pieces)
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype(np.int16)
    path = HERE / f"{stem}.ogg"
    with av.open(str(path), "w", format="ogg") as out:
        stream = out.add_stream("libopus", rate=RATE, layout="mono")
        stream.bit_rate = BITRATE
        frame = av.AudioFrame.from_ndarray(pcm[None], format="s16", layout="mono")
        frame.sample_rate = RATE
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    (HERE / f"{stem}.txt").write_text(text + "\n")
    (HERE / f"{stem}.lab").write_text("".join(f"{a:.3f}\t{b:.3f}\t{p}\n" for a, b, p in labels))
    print(f"{path.name}: {len(samples) / RATE:.2f} s, {path.stat().st_size} bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Regenerate the test voices (see SOURCES.md).")
    parser.add_argument(
        "voices", nargs="*", metavar="VOICE", help=f"default all: {', '.join(VOICES)}"
    )
    parser.add_argument(
        "--texts",
        nargs="+",
        choices=list(TEXTS),
        default=list(TEXTS),
        help="sets of sentences to make (default: all)",
    )
    parser.add_argument(
        "--librivox",
        type=Path,
        metavar="TARBALL",
        help="make only the recorded clips, from pocketsphinx-5.1.1.tar.gz (see SOURCES.md)",
    )
    args = parser.parse_args()
    if args.librivox:
        make_librivox(args.librivox)
        raise SystemExit(0)
    if unknown := set(args.voices) - set(VOICES):
        parser.error(f"unknown voice(s): {', '.join(sorted(unknown))}")
    for suffix, sentences in (TEXTS[name] for name in args.texts):
        for name, (synth, voice) in VOICES.items():
            if not args.voices or name in args.voices:
                make(name + suffix, synth, voice, sentences)

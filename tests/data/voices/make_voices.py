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
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import av
import numpy as np

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


def _festival(voice: str, text: str, wav: Path) -> list[tuple[float, str]]:
    segs = wav.with_suffix(".segs")
    script = (
        f"(voice_{voice})\n"
        f'(set! u (utt.synth (Utterance Text "{text}")))\n'
        f'(utt.save.wave u "{wav}" \'riff)\n'
        f'(utt.save.segs u "{segs}")\n'
    )
    subprocess.run(["festival", "--pipe"], input=script, check=True, text=True)
    rows = [line.split() for line in segs.read_text().splitlines()[1:] if line.strip()]
    return [(float(r[0]), r[2]) for r in rows]


def make(stem: str, synth: str, voice: str, sentences: tuple[str, ...]) -> None:
    pieces = [np.zeros(int(EDGE_S * RATE), np.float32)]
    labels: list[tuple[float, float, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k, text in enumerate(sentences):
            wav = Path(tmp) / f"{k}.wav"
            ends = (_flite if synth == "flite" else _festival)(voice, text, wav)
            audio = load_audio(wav, RATE)
            t0 = sum(len(p) for p in pieces) / RATE
            start = 0.0
            for end, phone in ends:
                if phone not in ("pau", "h#", "#"):
                    labels.append((t0 + start, t0 + end, phone))
                start = end
            pieces += [audio, np.zeros(int((GAP_S if k == 0 else EDGE_S) * RATE), np.float32)]
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
    (HERE / f"{stem}.txt").write_text(" ".join(sentences) + "\n")
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
    args = parser.parse_args()
    if unknown := set(args.voices) - set(VOICES):
        parser.error(f"unknown voice(s): {', '.join(sorted(unknown))}")
    for suffix, sentences in (TEXTS[name] for name in args.texts):
        for name, (synth, voice) in VOICES.items():
            if not args.voices or name in args.voices:
                make(name + suffix, synth, voice, sentences)

"""Files shipped with the package: a short speech clip (espeak-ng) for examples and benchmarks."""

from pathlib import Path

ASSETS = Path(__file__).parent
HELLO_WAV = ASSETS / "hello.wav"

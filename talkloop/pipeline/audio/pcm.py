"""PCM16 <-> float32: the one conversion between the wire format and the pipeline's samples.

Voice stacks, WebRTC and WAV files carry little-endian signed 16-bit PCM; the pipeline works on
float32 in ``[-1, 1]``. Decoding divides by 32768 (so -32768 maps to exactly -1); encoding clips to
full scale, multiplies by 32767 and rounds, so +1.0 and -1.0 both fit without wrapping.
"""

from __future__ import annotations

import numpy as np

__all__ = ["float_to_pcm16", "pcm16_to_float"]


def pcm16_to_float(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """Little-endian signed 16-bit PCM (bytes, or an int16 array of any shape) to float32 in
    ``[-1, 1)``, same shape."""
    pcm = np.frombuffer(data, dtype="<i2") if not isinstance(data, np.ndarray) else data
    if pcm.dtype != np.int16:
        raise ValueError(f"expected int16 PCM, got dtype {pcm.dtype}")
    return pcm.astype(np.float32) * np.float32(1.0 / 32768.0)


def float_to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples to int16 (native order, same shape), clipped to full scale and rounded."""
    x = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0) * 32767.0
    return np.rint(x).astype(np.int16)

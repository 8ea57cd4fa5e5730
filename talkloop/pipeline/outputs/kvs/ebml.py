"""Just enough EBML to cut a live Matroska stream into its header and its clusters.

A live (non-seekable) Matroska stream is an EBML header element, then a Segment of unknown size
whose children are Info, Tracks, Tags ... and then one Cluster after another. KVS maps each
Cluster to one fragment, so the producer needs the bytes before the first Cluster (sent again
at the start of every PutMedia connection) and each Cluster on its own.
"""

from __future__ import annotations

__all__ = ["CLUSTER_ID", "SEGMENT_ID", "cluster_timecode", "split_live_mkv"]

EBML_ID = 0x1A45DFA3
SEGMENT_ID = 0x18538067
CLUSTER_ID = 0x1F43B675
TIMESTAMP_ID = 0xE7


def read_id(buf: bytes, pos: int) -> tuple[int, int]:
    """The element ID at ``pos`` (marker bits kept, as IDs are written) and the position after."""
    length = _vint_length(buf, pos)
    return int.from_bytes(buf[pos : pos + length], "big"), pos + length


def read_size(buf: bytes, pos: int) -> tuple[int | None, int]:
    """The element data size at ``pos`` (None: unknown size) and the position after it."""
    length = _vint_length(buf, pos)
    raw = int.from_bytes(buf[pos : pos + length], "big")
    value = raw & ((1 << (7 * length)) - 1)  # strip the length marker bit
    unknown = value == (1 << (7 * length)) - 1  # all value bits set means "unknown"
    return (None if unknown else value), pos + length


def _vint_length(buf: bytes, pos: int) -> int:
    if pos >= len(buf):
        raise ValueError(f"EBML: truncated at byte {pos}")
    first = buf[pos]
    if first == 0:
        raise ValueError(f"EBML: invalid variable-length integer at byte {pos}")
    length = 9 - first.bit_length()
    if pos + length > len(buf):
        raise ValueError(f"EBML: truncated at byte {pos}")
    return length


def split_live_mkv(data: bytes) -> tuple[bytes, list[bytes]]:
    """Split a complete live Matroska byte string into (header, clusters).

    The header is every byte before the first Cluster (EBML header, Segment start, Info,
    Tracks, ...); each cluster is one whole Cluster element. Top-level elements after the
    clusters (Cues, Tags written at the end) are left out: a live stream has no end.

    Raises:
        ValueError: the bytes are not a Matroska stream this muxer writes.
    """
    element, pos = read_id(data, 0)
    if element != EBML_ID:
        raise ValueError("not a Matroska stream: no EBML header")
    size, pos = read_size(data, pos)
    if size is None:
        raise ValueError("EBML header of unknown size")
    pos += size
    element, pos = read_id(data, pos)
    if element != SEGMENT_ID:
        raise ValueError(f"expected a Segment after the EBML header, got ID {element:#x}")
    _, pos = read_size(data, pos)  # unknown for a live stream; children follow either way
    header_end: int | None = None
    clusters: list[bytes] = []
    while pos < len(data):
        start = pos
        element, pos = read_id(data, pos)
        size, pos = read_size(data, pos)
        if size is None:
            raise ValueError(f"element {element:#x} of unknown size inside the Segment")
        end = pos + size
        if end > len(data):
            raise ValueError(f"element {element:#x} truncated at byte {len(data)}")
        if element == CLUSTER_ID:
            if header_end is None:
                header_end = start
            clusters.append(data[start:end])
        pos = end
    return data[: header_end if header_end is not None else len(data)], clusters


def cluster_timecode(cluster: bytes) -> int:
    """The Timestamp of a Cluster element (in TimecodeScale units: ms for our muxer)."""
    element, pos = read_id(cluster, 0)
    if element != CLUSTER_ID:
        raise ValueError(f"not a Cluster: ID {element:#x}")
    size, pos = read_size(cluster, pos)
    end = len(cluster) if size is None else pos + size
    while pos < end:
        element, pos = read_id(cluster, pos)
        size, pos = read_size(cluster, pos)
        if size is None:
            break
        if element == TIMESTAMP_ID:
            return int.from_bytes(cluster[pos : pos + size], "big")
        pos += size
    raise ValueError("Cluster without a Timestamp")

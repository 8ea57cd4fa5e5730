"""KvsSink: a live copy of the stream to Amazon Kinesis Video Streams, never in the way.

Three stages, each on its own side of a bounded, drop-oldest hand-off:

    pipeline thread --write--> FrameQueueSink (frames)  --> encoder thread (FragmentWriter)
                    --> FragmentBuffer (fragments) --> uploader thread (PutMediaConnection)

``write`` only copies the frames into the queue and returns; when the encoder falls behind the
oldest frames are dropped, when the network is slow or down the oldest fragments are. Nothing
the mirror does raises into the pipeline after construction: a startup problem (no credentials,
unknown stream, endpoint unreachable) is logged once as one error line and the mirror stops;
network trouble later is retried with exponential backoff on a new connection that resumes on
a keyframe. ``status`` tells what happened.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import random
import re
import threading
import time
from dataclasses import dataclass, field

from talkloop.pipeline.core.errors import ConfigError, SessionClosedError
from talkloop.pipeline.core.records import AudioChunk, StreamInfo, VideoChunk
from talkloop.pipeline.outputs.kvs.buffer import FragmentBuffer
from talkloop.pipeline.outputs.kvs.mkv import FragmentWriter
from talkloop.pipeline.outputs.kvs.putmedia import (
    ACK_TYPES,
    AckEvent,
    KvsError,
    PutMediaConnection,
    resolve_data_endpoint,
)
from talkloop.pipeline.outputs.queue import FrameQueueSink

__all__ = ["KvsSink", "KvsStatus"]

log = logging.getLogger("talkloop.kvs")

_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,256}")


@dataclass(frozen=True)
class KvsStatus:
    """A snapshot of the mirror: where it is and what it has done."""

    stream_name: str
    state: str  # idle, starting, streaming, reconnecting, failed, closed
    fragments_produced: int = 0
    fragments_sent: int = 0
    fragments_resent: int = 0
    fragments_acked: dict[str, int] = field(default_factory=dict)  # per ACK EventType
    fragments_dropped: int = 0  # never sent: dropped while the network was slow or down
    frames_dropped: int = 0  # never encoded: the encoder fell behind
    reconnects: int = 0
    bytes_sent: int = 0
    last_error: str | None = None
    encode_ms_per_frame: float | None = None  # CPU time of the mirror's encoder thread
    ack_latency_ms: float | None = None  # last fragment: cut -> RECEIVED
    fragment_bytes: float | None = None  # mean size of a fragment

    def line(self) -> str:
        """One human line: what the render prints at the end."""
        acks = ", ".join(f"{self.fragments_acked.get(k, 0)} {k.lower()}" for k in ACK_TYPES[1:4])
        text = (
            f"kvs mirror {self.stream_name!r}: {self.state}; fragments {self.fragments_sent} "
            f"sent ({acks}), {self.fragments_dropped} dropped, {self.reconnects} reconnects"
        )
        if self.last_error:
            text += f"; last error: {self.last_error}"
        return text


class KvsSink:
    """Mirrors the published stream to a KVS stream (a Sink; it never blocks or fails it).

    Args:
        stream_name: an existing KVS stream.
        region: AWS region; None takes the standard AWS chain's.
        endpoint_url: control-plane endpoint (a local test server); None for AWS.
        data_endpoint_url: PutMedia endpoint, skipping GetDataEndpoint's answer (tests).
        fragment_seconds: media time per fragment (one GOP); KVS wants 1..10 s.
        preset: x264 preset of the mirror's own encoder.
        crf: x264 constant rate factor of the mirror's own encoder.
        max_queue_frames: frames waiting for the encoder at most (default one second's).
        max_fragments: fragments waiting for the network at most.
        timeout_s: connect timeout, and how long a send or the wait for any answer from the
            service may take before the connection counts as stuck and is replaced.
        drain_timeout_s: how long ``close`` waits for the last fragments to be acknowledged.
        backoff_s: (first, largest) wait between reconnection attempts; doubles each time.

    Raises:
        ConfigError: an invalid stream name or setting (at construction, before any work).
    """

    def __init__(
        self,
        stream_name: str,
        region: str | None = None,
        *,
        endpoint_url: str | None = None,
        data_endpoint_url: str | None = None,
        fragment_seconds: float = 2.0,
        preset: str = "veryfast",
        crf: int = 23,
        max_queue_frames: int | None = None,
        max_fragments: int = 30,
        timeout_s: float = 10.0,
        drain_timeout_s: float = 5.0,
        backoff_s: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        if not _STREAM_NAME.fullmatch(stream_name or ""):
            raise ConfigError(
                f"KVS stream name must be 1-256 characters of a-z A-Z 0-9 _ . -, "
                f"got {stream_name!r}"
            )
        if region is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
            raise ConfigError(f"KVS region looks wrong: {region!r} (e.g. eu-west-1)")
        if timeout_s <= 0 or drain_timeout_s < 0:
            raise ConfigError(
                f"KVS timeouts must be positive, got timeout_s={timeout_s}, "
                f"drain_timeout_s={drain_timeout_s}"
            )
        if not 0 < backoff_s[0] <= backoff_s[1]:
            raise ConfigError(f"KVS backoff_s must be (first, largest) > 0, got {backoff_s}")
        if max_queue_frames is not None and max_queue_frames < 1:
            raise ConfigError(f"KVS max_queue_frames must be >= 1, got {max_queue_frames}")

        if importlib.util.find_spec("boto3") is None:
            raise ConfigError(
                "the KVS mirror needs boto3: in the talkloop folder, pip install -e '.[kvs]'"
            )
        self.stream_name = stream_name
        self.region = region
        self.endpoint_url = endpoint_url
        self.data_endpoint_url = data_endpoint_url
        self.fragment_seconds = fragment_seconds
        self.preset = preset
        self.crf = crf
        self.max_queue_frames = max_queue_frames
        self.timeout_s = timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.backoff_s = backoff_s
        self.buffer = FragmentBuffer(max_fragments)
        FragmentWriter.check_settings(fragment_seconds, preset, crf)
        self._frames: FrameQueueSink | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()  # abort, or the drain deadline passed: stop now
        self._conn: PutMediaConnection | None = None
        # Guards the fields below, written by the encoder/uploader threads and read by
        # ``status`` on any thread: without it a snapshot could mix two moments.
        self._lock = threading.Lock()
        self._state = "idle"
        self._acks = dict.fromkeys(ACK_TYPES, 0)
        self._reconnects = 0
        self._bytes_sent = 0
        self._last_error: str | None = None
        self._cpu_s = 0.0
        self._frames_encoded = 0
        self._ack_latency_ms: float | None = None
        self._fragment_bytes = 0

    # -- Sink protocol -------------------------------------------------------------------------

    def open(self, info: StreamInfo) -> None:
        """Start the encoder and uploader threads; returns at once and never fails the stream."""
        if self._frames is not None:
            raise SessionClosedError(f"KvsSink for {self.stream_name!r} was already opened")
        maxsize = self.max_queue_frames or max(1, info.fps)
        self._frames = FrameQueueSink(maxsize, "drop_oldest")
        self._frames.open(info)
        self._set(state="starting")
        origin_s = time.time()  # media time 0 in Unix time: fragment timecodes are absolute
        encoder = threading.Thread(
            target=self._encode_loop, args=(info, origin_s), name="kvs-encoder", daemon=True
        )
        uploader = threading.Thread(
            target=self._upload_loop, args=(origin_s,), name="kvs-uploader", daemon=True
        )
        self._threads = [encoder, uploader]
        for thread in self._threads:
            thread.start()

    def write(self, video: VideoChunk, audio: AudioChunk) -> None:
        """Queue the segment for the mirror's encoder; returns at once (drops, never waits)."""
        frames = self._frames
        if frames is None or self.failed:
            return
        # SessionClosedError: the mirror stopped (failed or closing) since the check above.
        with contextlib.suppress(SessionClosedError):
            frames.write(video, audio)

    def close(self) -> None:
        """Finish: encode what is queued, send it, wait up to ``drain_timeout_s`` for acks."""
        if self._frames is None:
            return
        self._frames.close()  # the encoder drains the queue, flushes, then finishes the buffer
        deadline = time.monotonic() + self.drain_timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._shutdown()

    def abort(self) -> None:
        """Stop now: queued frames and unsent fragments are discarded."""
        if self._frames is None:
            return
        self._frames.abort()
        self._shutdown()

    # -- status --------------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self._state == "failed"

    @property
    def status(self) -> KvsStatus:
        """A consistent snapshot of the counters (safe from any thread)."""
        b = self.buffer
        frames = self._frames
        with self._lock:
            return KvsStatus(
                stream_name=self.stream_name,
                state=self._state,
                fragments_produced=b.produced,
                fragments_sent=b.sent,
                fragments_resent=b.resent,
                fragments_acked=dict(self._acks),
                fragments_dropped=b.dropped,
                frames_dropped=frames.dropped_frames if frames is not None else 0,
                reconnects=self._reconnects,
                bytes_sent=self._bytes_sent,
                last_error=self._last_error,
                encode_ms_per_frame=(
                    1000 * self._cpu_s / self._frames_encoded if self._frames_encoded else None
                ),
                ack_latency_ms=self._ack_latency_ms,
                fragment_bytes=self._fragment_bytes / b.produced if b.produced else None,
            )

    # -- internals -----------------------------------------------------------------------------

    def _set(self, **values: object) -> None:
        with self._lock:
            for name, value in values.items():
                setattr(self, f"_{name}", value)

    def _fail(self, err: BaseException) -> None:
        """A problem retrying cannot fix: one error line, then the mirror stops."""
        with self._lock:
            if self._state == "failed":
                return
            self._state = "failed"
            self._last_error = str(err)
        log.error("%s (the primary output carries on without the mirror)", err)
        self._stop.set()
        if self._frames is not None:
            self._frames.abort()  # frees queued frames; later writes are ignored
        self.buffer.finish()

    def _shutdown(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            conn.interrupt()  # unblocks a send stuck on a stalled connection
        for thread in self._threads:
            thread.join(self.timeout_s)
        self._threads = []
        with self._lock:
            if self._state != "failed":
                self._state = "closed"
        log.info("%s", self.status.line())

    def _encode_loop(self, info: StreamInfo, origin_s: float) -> None:
        frames = self._frames
        assert frames is not None
        try:
            writer = FragmentWriter(
                info,
                origin_s=origin_s,
                fragment_seconds=self.fragment_seconds,
                preset=self.preset,
                crf=self.crf,
            )
        except Exception as err:
            self._fail(KvsError(f"KVS mirror: cannot start the encoder: {err}", retryable=False))
            return
        try:
            while not self._stop.is_set():
                try:
                    frame = frames.get(timeout=0.1)
                except TimeoutError:
                    continue
                t0 = time.thread_time()
                fragments = writer.flush() if frame is None else writer.write(frame)
                with self._lock:
                    self._cpu_s += time.thread_time() - t0
                    self._frames_encoded = writer.frames_encoded
                    self._fragment_bytes += sum(len(f.data) for f in fragments)
                for fragment in fragments:
                    self.buffer.put(fragment, writer.header)
                if frame is None:
                    break
        except Exception as err:
            self._fail(KvsError(f"KVS mirror: encoder failed: {err}", retryable=False))
        finally:
            writer.close()
            self.buffer.finish()

    def _upload_loop(self, origin_s: float) -> None:
        try:
            url, region, credentials = resolve_data_endpoint(
                self.stream_name, self.region, self.endpoint_url, self.timeout_s
            )
        except KvsError as err:
            self._fail(err)
            return
        except Exception as err:  # anything else from boto3 at startup is just as final
            self._fail(KvsError(f"KVS mirror: startup failed: {err}", retryable=False))
            return
        url = self.data_endpoint_url or url
        attempt = 0
        while not self._stop.is_set():
            # Connect only once there is something to send (the header comes with it).
            if not self.buffer.has_unsent():
                if self.buffer.drained():
                    return
                time.sleep(0.02)
                continue
            conn = PutMediaConnection(
                url, self.stream_name, region, credentials, origin_s, self.timeout_s
            )
            self._conn = conn
            try:
                got_ack = self._stream(conn)
                if got_ack:
                    attempt = 0
                if self.buffer.drained():
                    self._set(state="closed")
                    return
                raise KvsError("KVS PutMedia: the service ended the request early", retryable=True)
            except (OSError, KvsError) as err:
                if self._stop.is_set():
                    return
                if isinstance(err, KvsError) and not err.retryable:
                    self._fail(err)
                    return
                resent = self.buffer.rewind()
                delay = min(self.backoff_s[1], self.backoff_s[0] * 2**attempt)
                delay *= random.uniform(0.5, 1.0)  # jitter: many mirrors must not retry in step
                attempt += 1
                with self._lock:
                    self._reconnects += 1
                    self._state = "reconnecting"
                    self._last_error = f"{type(err).__name__}: {err}"
                log.warning(
                    "KVS mirror %r: connection lost (%s); %d fragment(s) to resend, retrying in "
                    "%.1f s",
                    self.stream_name,
                    err,
                    resent,
                    delay,
                )
                self._stop.wait(delay)
            finally:
                conn.close()
                self._conn = None

    def _stream(self, conn: PutMediaConnection) -> bool:
        """Run one connection until the buffer is drained; True if any fragment was acked.

        Raises:
            OSError, KvsError: the connection failed, stalled or was refused.
        """
        conn.connect()
        header = self.buffer.header
        assert header is not None  # put with the first fragment, before it could be taken
        conn.send_chunk(header)
        self._set(state="streaming")
        got_ack = False
        ended = False
        last_rx = time.monotonic()
        while not self._stop.is_set():
            try:
                events = conn.poll(0.05 if ended else 0.0)
            except KvsError:
                if ended and self.buffer.unacked == 0:
                    return got_ack  # the service closed the finished request: all is through
                raise
            if events:
                last_rx = time.monotonic()
                got_ack |= self._handle(events)
            if not ended:
                fragment = self.buffer.take(timeout=0.02)
                if fragment is not None:
                    if self.buffer.unacked == 1:
                        last_rx = time.monotonic()  # the stall clock starts at the oldest unacked
                    conn.send_chunk(fragment.data)
                    with self._lock:
                        self._bytes_sent += len(fragment.data)
                elif self.buffer.finished and not self.buffer.has_unsent():
                    conn.end()
                    ended = True
            if self.buffer.unacked and time.monotonic() - last_rx > self.timeout_s:
                raise KvsError(f"KVS PutMedia: no answer for {self.timeout_s:g} s", retryable=True)
        return got_ack

    def _handle(self, events: list[AckEvent]) -> bool:
        acked = False
        for event in events:
            with self._lock:
                self._acks[event.kind] = self._acks.get(event.kind, 0) + 1
            if event.kind in ("RECEIVED", "PERSISTED") and event.timecode_ms is not None:
                done = self.buffer.acknowledge(event.timecode_ms)
                if done and event.kind == "RECEIVED":
                    latency = 1000 * (time.monotonic() - done[-1].cut_at)
                    self._set(ack_latency_ms=latency)
                acked = True
            elif event.kind == "ERROR":
                self.buffer.reject(event.timecode_ms)
                message = f"KVS ERROR ack {event.error_code} for fragment {event.timecode_ms}"
                self._set(last_error=message)
                log.warning("KVS mirror %r: %s", self.stream_name, message)
        return acked

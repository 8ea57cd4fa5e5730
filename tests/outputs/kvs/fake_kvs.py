"""A local stand-in for Kinesis Video Streams: GetDataEndpoint and the PutMedia contract.

It checks what the real service would: the SigV4 signature (recomputed here with hashlib/hmac,
independently of botocore), the x-amzn-* headers, and the streamed Matroska body, parsed
incrementally with its own EBML walker so every Cluster is acknowledged as it completes
(BUFFERING, RECEIVED, PERSISTED, or ERROR). It can be told to drop a connection after some
fragments, to stall (stop reading), or to answer ERROR for chosen fragments.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass
class Cluster:
    timecode_ms: int
    first_block_track: int  # track of the cluster's first block
    first_video_keyframe: bool  # the first video block of the cluster is a keyframe
    video_blocks: int
    audio_blocks: int


@dataclass
class Connection:
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    clusters: list[Cluster] = field(default_factory=list)
    signature_ok: bool = False
    completed: bool = False  # the client sent the last chunk
    dropped: bool = False  # we cut it on purpose


def sigv4_signature(
    method: str, path: str, headers: dict[str, str], secret: str, payload_hash: str
) -> tuple[str, str]:
    """Recompute (signature, access key) of a SigV4 ``Authorization`` header."""
    auth = headers["authorization"]
    algorithm, _, rest = auth.partition(" ")
    assert algorithm == "AWS4-HMAC-SHA256", auth
    fields = dict(part.strip().split("=", 1) for part in rest.split(","))
    access_key, date, region, service, terminator = fields["Credential"].split("/")
    signed = fields["SignedHeaders"].split(";")
    canonical_headers = "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in signed)
    canonical = "\n".join(
        [method, quote(path, safe="/~"), "", canonical_headers, ";".join(signed), payload_hash]
    )
    scope = f"{date}/{region}/{service}/{terminator}"
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            headers["x-amz-date"],
            scope,
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, terminator):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), access_key


class FakeKvs:
    """Run with ``with FakeKvs(...) as kvs:``; ``kvs.url`` is both control and data endpoint."""

    def __init__(
        self,
        access_key: str,
        secret_key: str,
        stream_name: str = "talkloop-test",
        region: str = "us-east-1",
        *,
        drop_after: int | None = None,
        error_on: frozenset[int] = frozenset(),
    ) -> None:
        self.access_key, self.secret_key = access_key, secret_key
        self.stream_name, self.region = stream_name, region
        self.drop_after = drop_after  # cut the first connection after this many clusters
        self.error_on = error_on  # global cluster indices answered with ERROR (code 4006)
        self.stall = threading.Event()  # while set, PutMedia handlers stop reading
        self.connections: list[Connection] = []
        self.signature_failures = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._clusters_seen = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.05)  # accept() wakes up to notice a stop
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> FakeKvs:
        t = threading.Thread(target=self._accept, name="fake-kvs", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self.stall.clear()
        self._threads[0].join(5)  # the accept loop: no new handlers after this
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        for t in self._threads:
            t.join(5)
        assert not any(t.is_alive() for t in self._threads), "fake KVS threads left running"

    # -- serving -----------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        reader = _Reader(conn)
        try:
            head = reader.until(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            if path == "/getDataEndpoint":
                body = reader.exact(int(headers.get("content-length", "0")))
                self._get_data_endpoint(conn, method, path, headers, body)
            elif path == "/putMedia":
                self._put_media(conn, reader, method, path, headers)
            else:
                _respond(conn, 404, {"message": f"no route {path}"})
        except (OSError, EOFError):
            pass
        finally:
            conn.close()

    def _check_signature(self, method: str, path: str, headers: dict, payload_hash: str) -> bool:
        try:
            signature, key = sigv4_signature(method, path, headers, self.secret_key, payload_hash)
        except (KeyError, ValueError, AssertionError):
            return False
        sent = headers["authorization"].rsplit("Signature=", 1)[1]
        ok = key == self.access_key and hmac.compare_digest(signature, sent)
        if not ok:
            self.signature_failures += 1
        return ok

    def _get_data_endpoint(self, conn, method, path, headers, body: bytes) -> None:
        if not self._check_signature(method, path, headers, hashlib.sha256(body).hexdigest()):
            _respond(conn, 403, {"message": "The request signature we calculated does not match"})
            return
        request = json.loads(body or b"{}")
        if request.get("StreamName") != self.stream_name:
            _respond(
                conn,
                404,
                {"message": "The requested stream is not found"},
                {"x-amzn-ErrorType": "ResourceNotFoundException"},
            )
            return
        _respond(conn, 200, {"DataEndpoint": self.url})

    def _put_media(self, conn, reader: _Reader, method, path, headers) -> None:
        record = Connection(headers=headers)
        with self._lock:
            self.connections.append(record)
            first_connection = len(self.connections) == 1
        signed = headers.get("authorization", "").split("SignedHeaders=")[-1].split(",")[0]
        must_sign = {"x-amzn-stream-name", "x-amzn-fragment-timecode-type", "x-amz-date", "host"}
        record.signature_ok = must_sign <= set(signed.split(";")) and self._check_signature(
            method, path, headers, EMPTY_SHA256
        )
        if not record.signature_ok:
            _respond(conn, 403, {"message": "The request signature we calculated does not match"})
            return
        if headers.get("x-amzn-stream-name") != self.stream_name:
            _respond(conn, 404, {"message": "stream not found"})
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        walker = _ClusterWalker()
        while True:
            while self.stall.is_set() and not self._stopping.is_set():
                self._stopping.wait(0.02)
            line = reader.until(b"\r\n")
            size = int(line.split(b";")[0], 16)
            if size == 0:
                reader.until(b"\r\n")
                record.completed = True
                conn.sendall(b"0\r\n\r\n")
                return
            data = reader.exact(size)
            reader.exact(2)
            record.body += data
            for cluster in walker.feed(data):
                record.clusters.append(cluster)
                with self._lock:
                    index = self._clusters_seen
                    self._clusters_seen += 1
                self._ack(conn, cluster, index)
                if first_connection and self.drop_after == len(record.clusters):
                    record.dropped = True
                    conn.shutdown(socket.SHUT_RDWR)
                    return

    def _ack(self, conn: socket.socket, cluster: Cluster, index: int) -> None:
        tc = cluster.timecode_ms
        events: list[dict] = [{"EventType": "BUFFERING", "FragmentTimecode": tc}]
        if index in self.error_on:
            events.append({"EventType": "ERROR", "FragmentTimecode": tc, "ErrorId": 4006})
        else:
            number = f"9134385233318{index:07d}"
            events.append(
                {"EventType": "RECEIVED", "FragmentTimecode": tc, "FragmentNumber": number}
            )
            events.append(
                {"EventType": "PERSISTED", "FragmentTimecode": tc, "FragmentNumber": number}
            )
        for event in events:
            payload = json.dumps(event).encode() + b"\n"
            conn.sendall(b"%x\r\n" % len(payload) + payload + b"\r\n")

    # -- results -------------------------------------------------------------------------------------

    def clusters(self) -> list[Cluster]:
        """Every cluster received, in arrival order, over all connections."""
        return [c for conn in self.connections for c in conn.clusters]


def _respond(conn: socket.socket, status: int, body: dict, extra: dict | None = None) -> None:
    data = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    )
    for k, v in (extra or {}).items():
        head += f"{k}: {v}\r\n"
    conn.sendall(head.encode() + b"Connection: close\r\n\r\n" + data)


class _Reader:
    """Buffered reads from a socket: up to a delimiter, or an exact count."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buf = conn, b""

    def _more(self) -> None:
        data = self.conn.recv(65536)
        if not data:
            raise EOFError
        self.buf += data

    def until(self, delim: bytes) -> bytes:
        while delim not in self.buf:
            self._more()
        out, _, self.buf = self.buf.partition(delim)
        return out

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


class _ClusterWalker:
    """Finds complete Clusters in a growing live Matroska stream (its own EBML reading)."""

    def __init__(self) -> None:
        self.buf = b""
        self.pos = 0
        self.in_segment = False

    def feed(self, data: bytes) -> list[Cluster]:
        self.buf += data
        out: list[Cluster] = []
        while True:
            element = _element(self.buf, self.pos)
            if element is None:
                return out
            eid, data_start, size = element
            if eid == 0x18538067:  # Segment: step inside (its size is unknown when live)
                self.pos = data_start
                continue
            if size is None or data_start + size > len(self.buf):
                return out
            if eid == 0x1F43B675:
                out.append(_parse_cluster(self.buf[data_start : data_start + size]))
            self.pos = data_start + size


def _vint(buf: bytes, pos: int, keep_marker: bool) -> tuple[int, int] | None:
    if pos >= len(buf):
        return None
    length = 8 - buf[pos].bit_length() + 1
    if pos + length > len(buf):
        return None
    value = int.from_bytes(buf[pos : pos + length], "big")
    if not keep_marker:
        value &= (1 << (7 * length)) - 1
    return value, length


def _element(buf: bytes, pos: int) -> tuple[int, int, int | None] | None:
    eid = _vint(buf, pos, keep_marker=True)
    if eid is None:
        return None
    size = _vint(buf, pos + eid[1], keep_marker=False)
    if size is None:
        return None
    length = size[1]
    unknown = size[0] == (1 << (7 * length)) - 1
    return eid[0], pos + eid[1] + length, None if unknown else size[0]


def _parse_cluster(data: bytes) -> Cluster:
    pos, timecode, first_track, first_video_key = 0, -1, -1, None
    counts = {1: 0, 2: 0}
    while pos < len(data):
        eid, start, size = _element(data, pos)
        assert size is not None
        if eid == 0xE7:
            timecode = int.from_bytes(data[start : start + size], "big")
        elif eid == 0xA3:  # SimpleBlock: track vint, int16 timecode, flags (0x80 = keyframe)
            track, n = _vint(data, start, keep_marker=False)
            flags = data[start + n + 2]
            counts[track] = counts.get(track, 0) + 1
            if first_track < 0:
                first_track = track
            if track == 1 and first_video_key is None:
                first_video_key = bool(flags & 0x80)
        pos = start + size
    return Cluster(timecode, first_track, bool(first_video_key), counts[1], counts[2])

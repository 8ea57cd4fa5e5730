"""The PutMedia client: the control-plane lookup and one long-lived, chunked upload.

Flow (AWS "PutMedia" API reference): ``GetDataEndpoint(StreamName, APIName="PUT_MEDIA")`` on the
``kinesisvideo`` control plane (boto3), then one ``POST /putMedia`` to that data endpoint whose
body is a single live Matroska stream sent with chunked transfer encoding for as long as the
session lasts. The service answers 200 at once and then streams acknowledgements on the same
connection: JSON objects ``{"EventType": BUFFERING|RECEIVED|PERSISTED|ERROR|IDLE,
"FragmentTimecode": ..., "FragmentNumber": ..., "ErrorId"/"ErrorCode": ...}`` separated by
newlines, inside a chunked response body.

Botocore has no PutMedia operation, so the request is written here over a plain socket (TLS for
https): a request head signed with SigV4, then one HTTP chunk per fragment. One thread does
both directions (``send_chunk`` and ``poll``): a TLS connection must not be read and written
from two threads at once.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from talkloop.pipeline.core.errors import TalkloopError
from talkloop.pipeline.outputs.kvs.sigv4 import sign_request_headers

__all__ = [
    "ACK_TYPES",
    "AckEvent",
    "KvsError",
    "PutMediaConnection",
    "ResponseReader",
    "resolve_data_endpoint",
]

ACK_TYPES = ("BUFFERING", "RECEIVED", "PERSISTED", "ERROR", "IDLE")
USER_AGENT = "talkloop-kvs/0.1"


class KvsError(TalkloopError):
    """The KVS mirror cannot stream: says why and, where it can, how to fix it.

    ``retryable`` is per instance: a dropped connection or a 5xx may succeed on a new
    connection; a missing stream, missing credentials or a refused signature never will.
    The mirror never ends the session it mirrors.
    """

    session_fatal = False

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class AckEvent:
    """One acknowledgement from the PutMedia response stream."""

    kind: str  # one of ACK_TYPES (or whatever new type the service sends)
    timecode_ms: int | None  # FragmentTimecode: the Cluster Timestamp it acknowledges
    fragment_number: str | None
    error_code: int | None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> AckEvent:
        code = obj.get("ErrorCode", obj.get("ErrorId"))
        timecode = obj.get("FragmentTimecode")
        return cls(
            kind=str(obj.get("EventType", "UNKNOWN")).upper(),
            timecode_ms=None if timecode is None else int(timecode),
            fragment_number=obj.get("FragmentNumber"),
            error_code=None if code is None else int(code),
        )


# -- control plane ---------------------------------------------------------------------------------


def resolve_data_endpoint(
    stream_name: str,
    region: str | None,
    endpoint_url: str | None = None,
    timeout_s: float = 10.0,
) -> tuple[str, str, Any]:
    """Find the stream's PutMedia endpoint and the credentials to sign with.

    Args:
        stream_name: the KVS stream (it must exist).
        region: AWS region; None takes the standard chain's (AWS_REGION, config file).
        endpoint_url: control-plane endpoint override (a local test server); None for AWS.
        timeout_s: connect and read timeout of the control-plane call.

    Returns:
        ``(data_endpoint_url, region, credentials)``; credentials are botocore's (refreshable:
        call ``get_frozen_credentials()`` before each signature).

    Raises:
        KvsError: no credentials, no region, stream not found, access denied, endpoint
            unreachable: all with ``retryable=False`` (a startup error is reported once).
    """
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    session = boto3.session.Session(region_name=region)
    region = session.region_name
    if not region:
        raise KvsError(
            "KVS mirror: no AWS region: pass --kvs-region or set AWS_REGION", retryable=False
        )
    credentials = session.get_credentials()
    if credentials is None:
        raise KvsError(
            "KVS mirror: no AWS credentials found (environment, ~/.aws/credentials, "
            "~/.aws/config, container or instance role): configure them, e.g. "
            "`aws configure` or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
            retryable=False,
        )
    config = Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"max_attempts": 2, "mode": "standard"},
    )
    client = session.client("kinesisvideo", endpoint_url=endpoint_url, config=config)
    try:
        reply = client.get_data_endpoint(StreamName=stream_name, APIName="PUT_MEDIA")
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        message = err.response.get("Error", {}).get("Message", str(err))
        if code == "ResourceNotFoundException":
            raise KvsError(
                f"KVS mirror: stream {stream_name!r} not found in {region}: create it "
                f"(aws kinesisvideo create-stream --stream-name {stream_name} "
                f"--data-retention-in-hours 24) or fix --kvs-stream/--kvs-region",
                retryable=False,
            ) from None
        raise KvsError(
            f"KVS mirror: GetDataEndpoint for {stream_name!r} in {region} failed: "
            f"{code}: {message}",
            retryable=False,
        ) from None
    except BotoCoreError as err:
        where = endpoint_url or f"the kinesisvideo endpoint of {region}"
        raise KvsError(f"KVS mirror: cannot reach {where}: {err}", retryable=False) from None
    finally:
        client.close()
    return reply["DataEndpoint"], region, credentials


# -- data plane ------------------------------------------------------------------------------------


class ResponseReader:
    """Incremental parser of the PutMedia response: status line, headers, chunked ACK stream.

    ``feed`` returns the ACK events completed by the bytes given. An HTTP status other than
    200 is raised as ``KvsError`` once the (short) error body is complete or the connection
    ends; 4xx other than 429 is not retryable (bad signature, unknown stream).
    """

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._buf = b""
        self._chunked = False
        self._chunk_left = 0  # bytes left in the current chunk (chunked body)
        self._body_left: int | None = None  # Content-Length body left, None: until close
        self._body = b""  # decoded body bytes not yet parsed into events
        self._done = False

    def feed(self, data: bytes) -> list[AckEvent]:
        self._buf += data
        if self.status is None and not self._parse_head():
            return []
        self._decode_body()
        if self.status != 200:
            if self._done:
                self._raise_status()
            return []
        return self._events()

    def eof(self) -> None:
        """The server closed the connection."""
        if self.status is not None and self.status != 200:
            self._raise_status()
        raise KvsError("KVS PutMedia: the server closed the connection", retryable=True)

    def _parse_head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > 65536:
                raise KvsError("KVS PutMedia: response head too long", retryable=True)
            return False
        lines = self._buf[:end].decode("latin-1").split("\r\n")
        self._buf = self._buf[end + 4 :]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise KvsError(f"KVS PutMedia: not an HTTP response: {lines[0]!r}", retryable=True)
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in self.headers:
            self._body_left = int(self.headers["content-length"])
        return True

    def _decode_body(self) -> None:
        if not self._chunked:
            take = self._buf if self._body_left is None else self._buf[: self._body_left]
            self._body += take
            self._buf = self._buf[len(take) :]
            if self._body_left is not None:
                self._body_left -= len(take)
                self._done = self._body_left == 0
            return
        while not self._done:
            if self._chunk_left == 0:
                line_end = self._buf.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(self._buf[:line_end].split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self._done = True  # last chunk; trailers are not used by the service
                    return
                self._buf = self._buf[line_end + 2 :]
                self._chunk_left = size + 2  # data plus its CRLF
            take = self._buf[: self._chunk_left]
            self._buf = self._buf[len(take) :]
            self._chunk_left -= len(take)
            # The chunk's trailing CRLF lands in the body too; JSON parsing skips whitespace.
            self._body += take
            if self._chunk_left:
                return

    def _events(self) -> list[AckEvent]:
        events: list[AckEvent] = []
        decoder = json.JSONDecoder()
        text = self._body.decode("utf-8", errors="replace")
        pos = 0
        while True:
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            if pos >= len(text):
                break
            try:
                obj, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break  # an object split across reads: wait for the rest
            if isinstance(obj, dict):
                events.append(AckEvent.from_json(obj))
            pos = end
        self._body = text[pos:].encode("utf-8")
        return events

    def _raise_status(self) -> None:
        message = self._body.decode("utf-8", errors="replace").strip()[:300]
        retryable = self.status is None or self.status >= 500 or self.status == 429
        raise KvsError(f"KVS PutMedia: HTTP {self.status}: {message}", retryable=retryable)


class PutMediaConnection:
    """One PutMedia request: a signed head, then one HTTP chunk per fragment.

    Args:
        url: the data endpoint (``https://s-xxxx.kinesisvideo.<region>.amazonaws.com``).
        stream_name: the KVS stream.
        region: signing region.
        credentials: botocore credentials.
        producer_start_s: ``x-amzn-producer-start-timestamp`` (Unix seconds).
        timeout_s: connect timeout and the longest a single send may block; a send that
            cannot finish within it means the network or the service is stuck.

    Not thread-safe, except ``interrupt`` which another thread may call to unblock it.
    """

    def __init__(
        self,
        url: str,
        stream_name: str,
        region: str,
        credentials: Any,
        producer_start_s: float,
        timeout_s: float = 10.0,
    ) -> None:
        self.url = url.rstrip("/") + "/putMedia"
        self.stream_name = stream_name
        self.region = region
        self.credentials = credentials
        self.producer_start_s = producer_start_s
        self.timeout_s = timeout_s
        self.reader = ResponseReader()
        self.bytes_sent = 0
        self._sock: socket.socket | None = None
        self._eof = False

    def connect(self) -> None:
        """Open the connection and send the signed request head.

        Raises:
            OSError: the endpoint is unreachable or refused the connection.
        """
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KvsError(f"KVS: bad data endpoint URL {self.url!r}", retryable=False)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        sock = socket.create_connection((parts.hostname, port), timeout=self.timeout_s)
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        self._sock = sock
        headers = {
            "Accept": "*/*",
            "Connection": "keep-alive",
            "Transfer-Encoding": "chunked",
            "User-Agent": USER_AGENT,
            "x-amzn-stream-name": self.stream_name,
            "x-amzn-fragment-timecode-type": "ABSOLUTE",
            "x-amzn-fragment-acknowledgment-required": "1",
            "x-amzn-producer-start-timestamp": f"{self.producer_start_s:.3f}",
        }
        frozen = self.credentials.get_frozen_credentials()
        signed = sign_request_headers("POST", self.url, headers, frozen, self.region)
        path = parts.path or "/"
        head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in signed.items())
        sock.sendall((head + "\r\n").encode("latin-1"))

    def send_chunk(self, data: bytes) -> None:
        """Send ``data`` as one HTTP chunk (blocks at most ``timeout_s``).

        Raises:
            OSError: the connection broke or stalled (``TimeoutError``).
        """
        sock = self._require()
        sock.sendall(b"%x\r\n" % len(data) + data + b"\r\n")
        self.bytes_sent += len(data)

    def end(self) -> None:
        """Send the last (empty) chunk: the Matroska stream is complete."""
        self._require().sendall(b"0\r\n\r\n")

    def poll(self, timeout: float = 0.0) -> list[AckEvent]:
        """Read what the service sent, waiting at most ``timeout`` s for the first byte.

        Raises:
            KvsError: an HTTP error status, or the connection was closed by the service.
            OSError: the connection broke.
        """
        sock = self._require()
        events: list[AckEvent] = []
        wait = timeout
        while True:
            # TLS may hold decrypted bytes that select() cannot see.
            pending = self._eof or (isinstance(sock, ssl.SSLSocket) and sock.pending() > 0)
            if not pending and not select.select([sock], [], [], wait)[0]:
                return events
            data = b"" if self._eof else sock.recv(65536)
            if not data:
                self._eof = True
                if events:
                    return events  # hand these over first; the next poll reports the close
                self.reader.eof()
            events.extend(self.reader.feed(data))
            wait = 0.0

    def interrupt(self) -> None:
        """From any thread: make blocked sends and reads on this connection fail now."""
        sock = self._sock
        if sock is not None:
            # The plain socket's shutdown, also for TLS: it only touches the descriptor, so it
            # is safe while the owning thread is inside an SSL call. OSError: already closed.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _require(self) -> socket.socket:
        if self._sock is None:
            raise OSError("KVS PutMedia connection is not open")
        return self._sock

"""The fragment buffer between the mirror's encoder and its uploader.

Fragments wait here until they are sent, and once sent until the service acknowledges them
(RECEIVED or PERSISTED), so that after a dropped connection the new connection resends what
the old one may have lost, starting on a fragment, i.e. on a keyframe. The buffer is bounded:
while the network is down the *oldest unsent* fragment is dropped (and counted) to make room,
so memory stays flat and the mirror catches up with the live edge when the network returns.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.outputs.kvs.mkv import Fragment

__all__ = ["FragmentBuffer"]


class FragmentBuffer:
    """Bounded, drop-oldest, thread-safe queue of fragments with resend-on-reconnect.

    Args:
        max_fragments: unsent fragments held at most (and, separately, sent ones awaiting an
            acknowledgement).

    Counters: ``produced``, ``dropped`` (never sent), ``sent`` (sent at least once),
    ``resent``, ``acked`` (RECEIVED or PERSISTED), ``rejected`` (ERROR acks), ``forgotten``
    (sent, then evicted while unacknowledged). ``produced == sent + dropped + unsent``.
    """

    def __init__(self, max_fragments: int) -> None:
        if max_fragments < 1:
            raise ConfigError(f"KVS max_fragments must be >= 1, got {max_fragments}")
        self.max_fragments = max_fragments
        self.header: bytes | None = None
        self.produced = self.dropped = self.sent = self.resent = 0
        self.acked = self.rejected = self.forgotten = 0
        self._unsent: deque[tuple[Fragment, bool]] = deque()  # (fragment, sent before)
        self._unacked: deque[Fragment] = deque()
        self._finished = False
        # One lock for all of it: the encoder thread puts, the uploader thread takes and acks,
        # the pipeline thread reads counters; without it a drop could race a take and the
        # same fragment be both sent and counted dropped.
        self._cond = threading.Condition()

    def put(self, fragment: Fragment, header: bytes | None = None) -> None:
        """Add a fragment (and the stream header, with the first); drop the oldest if full."""
        with self._cond:
            if header is not None and self.header is None:
                self.header = header
            self._unsent.append((fragment, False))
            self.produced += 1
            self._trim()
            self._cond.notify_all()

    def finish(self) -> None:
        """No more fragments will come."""
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def take(self, timeout: float) -> Fragment | None:
        """The next fragment to send (now counted as sent and awaiting its ack), or None."""
        with self._cond:
            if not self._unsent:
                self._cond.wait(timeout)
            if not self._unsent:
                return None
            fragment, before = self._unsent.popleft()
            if before:
                self.resent += 1
            else:
                self.sent += 1
            self._unacked.append(fragment)
            if len(self._unacked) > self.max_fragments:
                self._unacked.popleft()
                self.forgotten += 1
            return fragment

    def acknowledge(self, timecode_ms: int) -> list[Fragment]:
        """RECEIVED/PERSISTED up to ``timecode_ms``: those fragments need no resend."""
        with self._cond:
            done: list[Fragment] = []
            # Acks come in fragment order, so everything up to this timecode is through.
            while self._unacked and self._unacked[0].timecode_ms <= timecode_ms:
                done.append(self._unacked.popleft())
            self.acked += len(done)
            self._cond.notify_all()
            return done

    def reject(self, timecode_ms: int | None) -> None:
        """An ERROR ack: the service will not take this fragment; resending cannot help."""
        with self._cond:
            for fragment in list(self._unacked):
                if timecode_ms is None or fragment.timecode_ms == timecode_ms:
                    self._unacked.remove(fragment)
                    self.rejected += 1
                    break
            self._cond.notify_all()

    def rewind(self) -> int:
        """The connection was lost: unacknowledged fragments go back to the front for resend."""
        with self._cond:
            count = len(self._unacked)
            while self._unacked:
                self._unsent.appendleft((self._unacked.pop(), True))
            self._trim()
            return count

    def has_unsent(self) -> bool:
        with self._cond:
            return bool(self._unsent)

    def drained(self) -> bool:
        """Finished, everything sent and acknowledged."""
        with self._cond:
            return self._finished and not self._unsent and not self._unacked

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def unacked(self) -> int:
        with self._cond:
            return len(self._unacked)

    @property
    def unsent(self) -> int:
        with self._cond:
            return len(self._unsent)

    def wait_drained(self, timeout: float) -> bool:
        """Block until ``drained()`` or ``timeout`` s; True if drained."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (self._finished and not self._unsent and not self._unacked):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _trim(self) -> None:
        # Caller holds the lock.
        while len(self._unsent) > self.max_fragments:
            _, before = self._unsent.popleft()
            if before:
                self.forgotten += 1  # sent once already: not a "never sent" drop
            else:
                self.dropped += 1

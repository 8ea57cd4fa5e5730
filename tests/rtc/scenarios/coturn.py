"""A real TURN server (Debian's coturn) for the scenario scripts, on a loopback address only.

Run inside the private network namespace of tests/rtc/netns.py: ``TURN_HOST`` is added to its
``lo`` here, coturn listens and relays there only, and lets peers on loopback addresses in (it
refuses them by default). The log goes to a file the scenario reads to see what was relayed.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TURN_HOST = "127.0.0.3"
TURN_PORT = 3478
RELAY_PORTS = (49160, 49260)
USER, PASSWORD, REALM = "talkloop-test", "relay-password", "talkloop"


@dataclass
class Turn:
    url: str  # turn:HOST:PORT?transport=udp
    log: Path
    final: str | None = None  # the whole log once coturn has stopped

    def text(self) -> str:
        return self.final if self.final is not None else self.log.read_text(errors="replace")

    def relayed_peers(self) -> list[str]:
        """Peer addresses coturn opened permissions or channels to (what it relayed to)."""
        return sorted(set(re.findall(r"peer (\d+\.\d+\.\d+\.\d+)(?::\d+)? lifetime", self.text())))

    def peer_bytes(self) -> int:
        """Bytes coturn relayed to and from peers, over the allocations that have ended."""
        lines = re.findall(r"peer usage: .*?rb=(\d+), .*?sb=(\d+)", self.text())
        return sum(int(rb) + int(sb) for rb, sb in lines)

    def wait_for_usage(self, timeout: float = 5.0) -> None:
        """coturn logs an allocation's traffic when it frees it, a moment after the client
        deleted it (it frees allocations on a timer): wait until every allocation is freed, up
        to ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.text().count("peer usage:") < self.allocations():
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)

    def allocations(self) -> int:
        return len(re.findall(r"ALLOCATE processed, success", self.text()))


@contextlib.contextmanager
def coturn(transport: str = "udp") -> Iterator[Turn]:
    subprocess.run(["ip", "addr", "add", f"{TURN_HOST}/8", "dev", "lo"], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "turn.log"
        cmd = [
            "turnserver",
            "-n",  # no configuration file: only these options
            f"--listening-ip={TURN_HOST}",
            f"--relay-ip={TURN_HOST}",
            f"--listening-port={TURN_PORT}",
            f"--min-port={RELAY_PORTS[0]}",
            f"--max-port={RELAY_PORTS[1]}",
            "--allow-loopback-peers",
            "--no-cli",
            "--no-tls",
            "--no-dtls",
            "--lt-cred-mech",
            f"--user={USER}:{PASSWORD}",
            f"--realm={REALM}",
            "--fingerprint",
            f"--userdb={tmp}/turndb",
            f"--pidfile={tmp}/turn.pid",
            f"--log-file={log}",
            "--simple-log",
            "--no-stdout-log",
            "--verbose",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        turn = Turn(f"turn:{TURN_HOST}:{TURN_PORT}?transport={transport}", log)
        try:
            deadline = time.monotonic() + 10
            while "UDP listener opened on" not in (log.read_text() if log.exists() else ""):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"coturn did not start (exit {proc.poll()}):\n"
                        + (log.read_text()[-2000:] if log.exists() else "no log")
                    )
                time.sleep(0.05)
            yield turn
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if log.exists():
                turn.final = log.read_text(errors="replace")

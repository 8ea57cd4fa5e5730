"""A call from "another machine": `talkloop serve` on every address of this namespace (with TLS and
an access token, as a non-loopback --host demands) and Chromium in a second namespace, the two
joined by a veth pair.

Run by tests/rtc/netns.py, so this namespace is the test's own. The other namespace is a child
made with ``unshare -n``; the veth pair gets loopback-range addresses (SERVER_ADDR here,
CLIENT_ADDR there; ``route_localnet`` lets 127/8 cross a real link), and the broad local route
127.0.0.0/8 is removed on both sides so SERVER_ADDR is reached over the link, not through lo.
No packet can leave the two namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for support

from support import emit, serving, tiny_args  # noqa: E402

SERVER_ADDR, CLIENT_ADDR = "127.1.0.1", "127.1.0.2"
TOKEN = "another-machine-access-token"
HERE = Path(__file__).resolve().parent


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def link_up(pid: int) -> None:
    """veth pair: tl-srv (here, SERVER_ADDR) <-> tl-cli (in ``pid``'s namespace, CLIENT_ADDR)."""
    sh("ip", "route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local")
    sh("ip", "link", "add", "tl-srv", "type", "veth", "peer", "name", "tl-cli", "netns", str(pid))
    sh("ip", "addr", "add", f"{SERVER_ADDR}/24", "dev", "tl-srv")
    sh("sysctl", "-qw", "net.ipv4.conf.tl-srv.route_localnet=1")
    # No IPv6 on the link: its link-local address, added a moment after the link comes up, is
    # a network change to Chromium, which then fails the page load (ERR_NETWORK_CHANGED).
    no_v6 = "sysctl -qw net.ipv6.conf.{}.disable_ipv6=1 2>/dev/null || true"
    sh("sh", "-c", no_v6.format("tl-srv"))
    sh("ip", "link", "set", "tl-srv", "up")
    there = (
        "ip link set lo up && ip route del local 127.0.0.0/8 dev lo table local && "
        f"ip addr add {CLIENT_ADDR}/24 dev tl-cli && "
        f"sysctl -qw net.ipv4.conf.tl-cli.route_localnet=1 && ({no_v6.format('tl-cli')}) && "
        "ip link set tl-cli up"
    )
    sh("nsenter", "-t", str(pid), "-n", "sh", "-c", there)


def serve_args(tmp: str) -> list[str]:
    token_file = Path(tmp) / "token"
    token_file.write_text(TOKEN + "\n")
    args = [*tiny_args(128), "--port", "0", "--host", SERVER_ADDR]  # the veth end only
    args += ["--tls-self-signed", SERVER_ADDR, "--tls-dir", f"{tmp}/tls"]
    return [*args, "--access-token-file", str(token_file), "--ice-server", "none"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--screenshot", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, serving(serve_args(tmp), timeout=120) as served:
        page = [sys.executable, str(HERE / "remote_page.py"), "--url", served.url, "--token", TOKEN]
        page += ["--seconds", str(args.seconds), "--screenshot", args.screenshot]
        # The other machine waits for a line on stdin: its end of the link must exist first.
        other = subprocess.Popen(
            ["unshare", "-n", "sh", "-c", 'read go && exec "$0" "$@"', *page],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        own, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 10
        while os.readlink(f"/proc/{other.pid}/ns/net") == own:  # until unshare has run
            if other.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the other machine's namespace did not appear")
            time.sleep(0.01)
        link_up(other.pid)
        out, err = other.communicate("go\n", timeout=120)
        lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
        if other.returncode != 0 or not lines:
            raise RuntimeError(f"the other machine failed ({other.returncode}):\n{out}\n{err}")
        page_result = json.loads(lines[-1][len("RESULT ") :])
        serve_out, serve_err = served.stop()
    emit(
        {
            **page_result,
            "serving_line": served.line,
            "server_addr": SERVER_ADDR,
            "client_addr": CLIENT_ADDR,
            "serve_exit": served.proc.returncode,
            "serve_err": serve_err[-2000:],
            "serve_out": serve_out[-1000:],
        }
    )


main()

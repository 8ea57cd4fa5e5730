"""`talkloop serve` refuses bad settings with one line and exit code 2 (no traceback)."""

from __future__ import annotations

import socket

import pytest

from pipeline.cli import main

pytestmark = pytest.mark.unit
TINY = ["--untrained", "--preset", "tiny", "--size", "64"]


def test_bad_playout_delay(capsys) -> None:
    code = main(["serve", *TINY, "--playout-delay-ms", "10"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("talkloop: error: --playout-delay-ms") and "\n" not in err


def test_port_in_use(capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", *TINY, "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err

"""`talkloop serve` refuses bad settings with one line and exit code 2 (no traceback)."""

from __future__ import annotations

import socket

import pytest

from talkloop.pipeline.cli import main

from support import tiny_args

pytestmark = pytest.mark.unit
TINY = tiny_args()


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


@pytest.mark.parametrize("value", ["50", "60001"])
def test_bad_max_lag(capsys, value: str) -> None:
    code = main(["serve", *TINY, "--max-lag-ms", value])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("talkloop: error: --max-lag-ms: ") and "\n" not in err
    assert err.endswith(f"got {value}")


def test_max_lag_reaches_the_calls(monkeypatch, capsys) -> None:
    import talkloop.pipeline.cli
    from talkloop.rtc.call import CallConfig

    seen: list[CallConfig] = []

    async def fake_serve_forever(
        config, reference, prompt, host, port, max_sessions, call_config, *a, **k
    ):
        seen.append(call_config)

    monkeypatch.setattr(talkloop.pipeline.cli, "serve_forever", fake_serve_forever)
    assert main(["serve", *TINY, "--max-lag-ms", "400", "--playout-delay-ms", "700"]) == 0
    assert main(["serve", *TINY]) == 0
    assert (seen[0].max_lag_ms, seen[0].playout_delay_ms) == (400, 700)
    assert seen[1] == CallConfig()  # without the flags: the defaults


def test_help_documents_max_lag(capsys) -> None:
    from talkloop.rtc.call import CallConfig

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-lag-ms MS" in text and f"default {CallConfig().max_lag_ms}" in text

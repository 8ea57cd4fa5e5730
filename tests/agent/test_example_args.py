"""examples/agent.py takes the agent URL exactly as the page shows it, or a /ws URL and a token."""

from __future__ import annotations

import re

import pytest

from talkloop.rtc.server import session_token

pytestmark = pytest.mark.unit


def test_session_tokens_never_start_with_a_dash_nor_need_quoting() -> None:
    # token_urlsafe starts one token in 32 with "-": among 2000 that fails with p ~ 1e-27
    tokens = {session_token() for _ in range(2000)}
    assert len(tokens) == 2000
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in tokens)


def test_the_url_the_page_shows_works_as_it_is(example) -> None:
    token = session_token()
    shown = f"ws://127.0.0.1:8080/ws?token={token}&role=agent"  # talkloop/web/app.js, agent-url
    args = example.parse_args(["--url", shown, "Hello."])
    assert args.url == shown and args.lines == ["Hello."]


def test_a_token_given_apart_is_joined_to_the_url(example) -> None:
    args = example.parse_args(["--url", "wss://example.org:8443/ws", "--token", "abc123"])
    assert args.url == "wss://example.org:8443/ws?token=abc123&role=agent"
    # a token from an older server that starts with "-" still goes through as --token=...
    args = example.parse_args(["--token=-abc", "Hi."])
    assert args.url == "ws://127.0.0.1:8080/ws?token=-abc&role=agent"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no session token: pass the agent URL the page shows"),
        (["--url", "ws://h:1/ws?token=aa&role=agent", "--token", "bb"], "differs from the token"),
        (["--url", "http://h:1/ws", "--token", "aa"], "must be a ws:// or wss:// URL"),
    ],
)
def test_bad_target_is_one_clear_line(example, capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as done:
        example.parse_args(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and message in err

"""`--kvs-stream` with several live sessions: one stream per session, or a clear refusal."""

from __future__ import annotations

import pytest
from kvs_helpers import clean_aws_env, kvs_threads

from talkloop.pipeline.cli import main
from talkloop.pipeline.core.errors import ConfigError
from talkloop.pipeline.outputs.kvs.args import kvs_stream_name

from support import tiny_args

pytestmark = pytest.mark.unit
TINY = tiny_args()


@pytest.fixture(autouse=True)
def no_aws_config(monkeypatch, tmp_path) -> None:
    clean_aws_env(monkeypatch, tmp_path)


def test_one_stream_for_several_sessions_is_refused_at_start(served, capsys) -> None:
    code = main(["serve", *TINY, "--max-sessions", "3", "--kvs-stream", "avatar"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and not served
    assert err.startswith("talkloop: error: --kvs-stream 'avatar' with --max-sessions 3")
    assert "--kvs-stream 'avatar-{session}'" in err and "avatar-1 to avatar-3" in err


def test_each_session_mirrors_into_the_stream_of_its_slot(served) -> None:
    assert main(["serve", *TINY, "--max-sessions", "3", "--kvs-stream", "avatar-{session}"]) == 0
    factory = served[0]["mirror_factory"]
    names = [[s.stream_name for s in factory(slot)] for slot in (1, 2, 3)]
    assert names == [["avatar-1"], ["avatar-2"], ["avatar-3"]]
    assert not kvs_threads()  # made, never opened: nothing started


def test_a_single_session_may_keep_a_plain_name(served) -> None:
    assert main(["serve", *TINY, "--kvs-stream", "avatar"]) == 0
    assert [s.stream_name for s in served[0]["mirror_factory"](1)] == ["avatar"]


def test_a_template_that_makes_a_bad_name_is_refused_at_start(served, capsys) -> None:
    code = main(["serve", *TINY, "--max-sessions", "2", "--kvs-stream", "my avatar {session}"])
    assert code == 2 and "KVS stream name must be" in capsys.readouterr().err and not served


def test_render_has_no_sessions_to_name(tmp_path, capsys) -> None:
    out = tmp_path / "o.mp4"
    code = main(["render", "--audio", "x.wav", "--out", str(out), "--kvs-stream", "a-{session}"])
    err = capsys.readouterr().err
    assert code == 2 and "this command writes one stream: give its name" in err
    assert not out.exists()


def test_stream_name_template() -> None:
    assert kvs_stream_name("cam-{session}-{session}", 12) == "cam-12-12"
    assert kvs_stream_name("cam", 12) == "cam" == kvs_stream_name("cam")
    with pytest.raises(ConfigError, match="one stream per live session"):
        kvs_stream_name("cam-{session}")

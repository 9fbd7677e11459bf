"""The per-chunk benchmark measures the real push path: each piece reaches the client, framed."""

from __future__ import annotations

import pytest

from benchmarks.chunk_path import LINE, PIECE, chain, collapsed_chain, main, run

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("lane", [False, True])
async def test_each_upstream_piece_is_written_to_the_client_as_one_chunk(lane: bool) -> None:
    feed, transport = chain(lane=lane)
    for _ in range(3):
        feed(PIECE)
    assert transport.writes == 3
    assert transport.last == b"%x\r\n%b\r\n" % (len(LINE), LINE)  # the line, relayed unchanged


async def test_a_short_run_gives_three_timings() -> None:
    result = await run(64)
    assert set(result) == {
        "hot",
        "in turn",
        "evicted",
        "lane, in turn",
        "lane, evicted",
        "one function, in turn",
        "one function, evicted",
    }
    assert all(value > 0 for value in result.values())


def test_no_chunks_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--chunks", "0"])
    assert "--chunks" in capsys.readouterr().err


async def test_the_prototype_relays_each_piece_unchanged_and_refuses_a_broken_one() -> None:
    feed, transport = collapsed_chain()
    feed(PIECE)
    assert transport.writes == 1
    assert transport.last == PIECE
    with pytest.raises(Exception, match="callback"):  # httptools wraps the callback's error
        feed(b"%x\r\n%b\r\n" % (len(b"[1]\n"), b"[1]\n"))

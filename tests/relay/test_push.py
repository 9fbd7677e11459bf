"""`Pump`, the push path's callbacks (gateway.relay.push), against a scripted source and writer.

The end-to-end behaviour (a real `gateway serve`, the emulator, real clients) is covered by the
relay's and the server's tests, which run on the push path; these pin each rule of the pump on
its own: order, the idle deadline, the client's backpressure and stall, slicing, the drain,
failures and detaching.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from gateway.neutral import Chunk
from gateway.relay.push import (
    DRAIN_LIMIT,
    READ_SLICE,
    BodySink,
    ClientStalledError,
    Divertible,
    Pump,
    is_divertible,
)
from gateway.upstream.dialects.base import StreamBrokenError
from tests.support.client import MODEL
from tests.support.stack import Gateway


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Source:
    """A `Divertible` whose pieces the test pushes; records pauses."""

    def __init__(self) -> None:
        self.sink: BodySink | None = None
        self.paused = False
        self.pauses = 0

    def divert(self, sink: BodySink | None) -> None:
        self.sink = sink

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False


class Writer:
    """A `Writer` that records what it is given."""

    def __init__(self) -> None:
        self.listener: Callable[[bool], None] | None = None
        self.paused = False

    def ready(self) -> bool:
        return True

    def write(self, body: bytes) -> None:
        raise AssertionError("the pump delivers; the deliver callback writes")

    def watch(self, listener: Callable[[bool], None] | None) -> None:
        self.listener = listener

    def pause(self, paused: bool) -> None:
        self.paused = paused
        if self.listener is not None:
            self.listener(paused)


class Lines:
    """A `Decoding` over lines: `done` ends the answer; `bad` is a broken stream."""

    def __init__(self, idle: float = 5.0) -> None:
        self.idle = idle
        self.buffer = b""
        self.fed: list[int] = []
        self.failures: list[tuple[str, bool]] = []

    def feed(self, data: bytes) -> list[Chunk]:
        self.fed.append(len(data))
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        chunks = []
        for line in lines:
            if line == b"bad":
                broken = StreamBrokenError("not a line of this dialect")
                broken.chunks = chunks
                raise broken
            chunks.append(Chunk(text=line.decode(), done=line == b"done"))
        return chunks

    def finished_by(self, chunk: Chunk) -> bool:
        return chunk.done or chunk.error is not None

    def idle_due(self, last: float) -> tuple[float, bool]:
        return last + self.idle, False

    def failed(self, exc: BaseException, *, request_deadline: bool) -> Chunk:
        self.failures.append((type(exc).__name__, request_deadline))
        return Chunk.failure(f"failed: {type(exc).__name__}")


def texts(delivered: list[list[Chunk]]) -> list[str]:
    return [chunk.text or f"!{chunk.error}" for batch in delivered for chunk in batch]


def pump(
    decoding: Lines | None = None, client_idle: float = 5.0
) -> tuple[Pump, Source, Writer, Lines, list[list[Chunk]]]:
    source, writer, lines = Source(), Writer(), decoding or Lines()
    delivered: list[list[Chunk]] = []
    return (
        Pump(source, lines, delivered.append, writer, client_idle),
        source,
        writer,
        lines,
        delivered,
    )


async def started(p: Pump) -> asyncio.Task[str]:
    task = asyncio.ensure_future(p.wait())
    await asyncio.sleep(0)  # the pump diverts the source
    return task


def test_is_divertible_answers_as_isinstance_and_per_class() -> None:
    async def reads():  # type: ignore[no-untyped-def]
        yield b""

    class Half:  # divert, but no flow control: not a Divertible
        def divert(self, sink: object) -> None: ...

    for source in (Source(), reads(), Half(), b"", None, Source()):
        assert is_divertible(source) is isinstance(source, Divertible)
    assert is_divertible(Source())
    assert not is_divertible(reads())


@pytest.mark.anyio
async def test_each_read_is_delivered_from_the_callback_and_the_end_follows_the_body() -> None:
    p, source, _, _, delivered = pump()
    task = await started(p)
    assert source.sink is p
    p.body(b"a\nb")
    assert texts(delivered) == ["a"]  # delivered inside the callback, no turn of the loop
    p.body(b"\ndone\n")
    assert texts(delivered) == ["a", "b", "done"]
    assert not task.done()  # the body's end is drained, to keep the connection
    p.end()
    assert await task == "done"
    assert source.sink is None
    assert p.received == len(b"a\nb\ndone\n")


@pytest.mark.anyio
async def test_a_body_ended_before_the_final_chunk_is_left_to_the_decoder() -> None:
    p, _, _, _, delivered = pump()
    task = await started(p)
    p.body(b"a\n")
    p.end()
    assert await task == "end"
    assert texts(delivered) == ["a"]


@pytest.mark.anyio
async def test_an_upstream_silent_for_the_idle_timeout_ends_with_one_error_chunk() -> None:
    p, source, _, lines, delivered = pump(Lines(idle=0.05))
    task = await started(p)
    p.body(b"a\n")
    assert await asyncio.wait_for(task, 5) == "done"
    assert lines.failures == [("TimeoutError", False)]
    assert texts(delivered) == ["a", "!failed: TimeoutError"]
    assert source.sink is None


@pytest.mark.anyio
async def test_reads_keep_moving_the_idle_deadline() -> None:
    p, _, _, lines, delivered = pump(Lines(idle=0.2))
    task = await started(p)
    for _ in range(6):  # 0.3 s of reads, each within the idle timeout
        p.body(b"x\n")
        await asyncio.sleep(0.05)
    p.body(b"done\n")
    p.end()
    assert await task == "done"
    assert lines.failures == []
    assert len(texts(delivered)) == 7


@pytest.mark.anyio
async def test_a_client_that_stops_reading_pauses_the_upstream_then_is_dropped() -> None:
    p, source, writer, lines, _ = pump(Lines(idle=0.05), client_idle=0.2)
    task = await started(p)
    writer.pause(True)
    assert source.paused
    await asyncio.sleep(0.1)  # the upstream's idle deadline does not run meanwhile
    assert not task.done()
    with pytest.raises(ClientStalledError):
        await asyncio.wait_for(task, 5)
    assert lines.failures == []
    assert writer.listener is None  # detached


@pytest.mark.anyio
async def test_a_client_that_reads_again_resumes_the_upstream() -> None:
    p, source, writer, _, delivered = pump(client_idle=0.2)
    task = await started(p)
    writer.pause(True)
    await asyncio.sleep(0.1)
    writer.pause(False)
    assert not source.paused
    await asyncio.sleep(0.15)  # past the stall timeout counted from the pause
    p.body(b"done\n")
    p.end()
    assert await task == "done"
    assert texts(delivered) == ["done"]


@pytest.mark.anyio
async def test_a_long_read_is_decoded_a_slice_a_turn_with_reading_paused() -> None:
    p, source, _, lines, delivered = pump()
    task = await started(p)
    piece = (b"y" * 1000 + b"\n") * (3 * READ_SLICE // 1000)
    p.body(piece + b"done\n")
    assert lines.fed == []  # nothing decoded inside the callback
    assert source.paused
    p.end()  # queued behind the slices
    assert await task == "done"
    assert max(lines.fed) <= READ_SLICE
    assert sum(lines.fed) == len(piece) + len(b"done\n")
    assert texts(delivered)[-1] == "done"
    assert not source.paused


@pytest.mark.anyio
async def test_a_body_ended_behind_the_slices_of_its_final_chunk_is_not_drained(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The final chunk and the body's end in one long read: nothing is left to drain, so the
    # client must not wait for the drain's bound (made an hour here: a wait would fail below).
    monkeypatch.setattr("gateway.relay.push.DRAIN_SECONDS", 3600.0)
    p, source, _, lines, delivered = pump()
    task = await started(p)
    piece = (b"y" * 1000 + b"\n") * (3 * READ_SLICE // 1000)
    p.body(piece + b"done\n")
    p.end()
    assert await asyncio.wait_for(task, 30) == "done"
    assert texts(delivered)[-1] == "done"
    assert lines.failures == []
    assert source.sink is None


@pytest.mark.anyio
async def test_a_failure_behind_the_slices_of_a_long_read_comes_after_them() -> None:
    # As on the pull path: what arrived before the failure is decoded first; a read that held
    # the final chunk completes the answer, one that did not ends with one error chunk.
    piece = (b"y" * 1000 + b"\n") * (3 * READ_SLICE // 1000)
    p, _, _, lines, delivered = pump()
    task = await started(p)
    p.body(piece + b"done\n")
    p.fail(ConnectionResetError())
    assert await asyncio.wait_for(task, 30) == "done"
    assert texts(delivered)[-1] == "done"
    assert lines.failures == []

    p, _, _, lines, delivered = pump()
    task = await started(p)
    p.body(piece)
    p.fail(ConnectionResetError())
    assert await asyncio.wait_for(task, 30) == "done"
    assert texts(delivered)[-1] == "!failed: ConnectionResetError"
    assert len(texts(delivered)) == piece.count(b"\n") + 1
    assert lines.failures == [("ConnectionResetError", False)]


@pytest.mark.anyio
async def test_a_broken_stream_delivers_its_good_chunks_then_one_error() -> None:
    p, _, _, lines, delivered = pump()
    task = await started(p)
    p.body(b"a\nbad\n")
    assert await task == "done"
    assert texts(delivered) == ["a", "!failed: StreamBrokenError"]
    assert lines.failures == [("StreamBrokenError", False)]


@pytest.mark.anyio
async def test_a_connection_lost_mid_answer_ends_with_one_error_chunk() -> None:
    p, _, _, _, delivered = pump()
    task = await started(p)
    p.body(b"a\n")
    p.fail(ConnectionResetError())
    assert await task == "done"
    assert texts(delivered) == ["a", "!failed: ConnectionResetError"]


@pytest.mark.anyio
async def test_a_connection_lost_after_the_final_chunk_loses_nothing() -> None:
    p, _, _, lines, delivered = pump()
    task = await started(p)
    p.body(b"done\n")
    p.fail(ConnectionResetError())
    assert await task == "done"
    assert texts(delivered) == ["done"]
    assert lines.failures == []


@pytest.mark.anyio
async def test_the_drain_stops_at_its_limit() -> None:
    p, _, _, _, _ = pump()
    task = await started(p)
    p.body(b"done\n")
    p.body(b"z" * (DRAIN_LIMIT + 1))
    assert await task == "done"


@pytest.mark.anyio
async def test_a_cancelled_wait_detaches_and_later_reads_deliver_nothing() -> None:
    p, source, writer, _, delivered = pump()
    task = await started(p)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert source.sink is None
    assert writer.listener is None
    p.body(b"late\n")
    assert delivered == []


def test_a_stream_through_the_gateway_takes_the_push_path(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[str] = []
    wait = Pump.wait

    async def counted(self: Pump) -> str:
        how = await wait(self)
        waits.append(how)
        return how

    monkeypatch.setattr(Pump, "wait", counted)
    body = {"model": MODEL, "prompt": "hello", "stream": True}
    with httpx.stream(
        "POST", f"{gateway.url}/api/generate", json=body, headers=gateway.headers(), timeout=30
    ) as response:
        assert response.status_code == 200
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines[-1]["done"] is True
    assert "".join(line["response"] for line in lines) != ""
    assert waits == ["done"]


@pytest.mark.anyio
async def test_the_lane_relays_the_reads_it_takes_and_the_decoder_gets_the_rest() -> None:
    taken: list[bytes] = []

    def lane(piece: bytes) -> bool:  # takes the reads that begin with `fast`
        if piece.startswith(b"fast"):
            taken.append(piece)
            return True
        return False

    source, writer, lines = Source(), Writer(), Lines()
    delivered: list[list[Chunk]] = []
    p = Pump(source, lines, delivered.append, writer, 5.0, lane)
    task = await started(p)
    p.body(b"fast 1\n")
    p.body(b"a\n")
    p.body(b"fast 2\n")
    assert taken == [b"fast 1\n", b"fast 2\n"]
    assert texts(delivered) == ["a"]
    assert lines.fed == [2]  # the decoder saw only the read the lane refused
    long = b"fast" + b"x" * READ_SLICE + b"\n"
    p.body(long)  # a long read is sliced by the pump, never given to the lane whole
    assert taken == [b"fast 1\n", b"fast 2\n"]
    await asyncio.sleep(0.01)
    assert sum(lines.fed[1:]) == len(long)
    p.body(b"done\n")
    p.body(b"fast 3\n")  # after the final chunk: drained, not relayed
    assert taken == [b"fast 1\n", b"fast 2\n"]
    assert texts(delivered)[-1] == "done"
    assert p.received == 7 + 2 + 7 + len(long) + 5 + 7
    p.end()
    assert await task == "done"


class LaneWatch:
    """`NdjsonDecoder.lane` wrapped: records the reads it took; `enabled = False` turns it off.

    Args:
        translated: Whether the streams watched are translated (a codec's `text_event` given)
            or the upstream's own lines (none given); asserted for every lane made.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, translated: bool) -> None:
        from gateway.upstream.dialects.ollama import NdjsonDecoder

        self.taken: list[bytes] = []
        self.enabled = True
        make = NdjsonDecoder.lane

        def watched(decoder, tick, write, text_event=None):  # type: ignore[no-untyped-def]
            assert (text_event is not None) is translated
            relay = make(decoder, tick, write, text_event)

            def counted(piece: bytes) -> bool:
                if not self.enabled:
                    return False  # the long way, for a comparison
                done = relay(piece)
                if done:
                    self.taken.append(piece)
                return done

            return counted

        monkeypatch.setattr(NdjsonDecoder, "lane", watched)


def test_a_streamed_ollama_answer_goes_through_the_decoders_lane(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    lane = LaneWatch(monkeypatch, translated=False)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream(
        "POST", f"{gateway.url}/api/chat", json=body, headers=gateway.headers(), timeout=30
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    objects = [json.loads(line) for line in lines]
    assert objects[-1]["done"] is True
    assert len(objects) >= 4
    # Every line but the first (delivered with the answer's start) and the final one took the
    # lane, and reached the client as the upstream wrote it.
    assert [piece.rstrip(b"\n").decode() for piece in lane.taken] == lines[1:-1]
    assert objects[-1]["eval_count"] == len(objects) - 1


def test_an_openai_client_gets_the_same_stream_with_the_lane_as_without(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai

    lane = LaneWatch(monkeypatch, translated=True)

    def stream() -> list[tuple[object, ...]]:
        with openai.OpenAI(
            base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0
        ) as client:
            events = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], stream=True
            )
            return [
                (
                    event.object,
                    event.model,
                    choice.index,
                    choice.delta.role,
                    choice.delta.content,
                    choice.finish_reason,
                )
                for event in events
                for choice in event.choices
            ]

    laned = stream()
    # Every token's line but the first (which carries the role) took the lane; the finish
    # event came from the final line, the long way.
    assert len(lane.taken) == len(laned) - 2 > 0
    assert laned[-1][-1] == "stop"
    lane.enabled = False
    assert stream() == laned


@pytest.mark.anyio
async def test_a_lane_that_raises_ends_the_stream_with_one_error_chunk() -> None:
    def lane(piece: bytes) -> bool:
        raise RuntimeError("a bug")

    source, writer, lines = Source(), Writer(), Lines()
    delivered: list[list[Chunk]] = []
    p = Pump(source, lines, delivered.append, writer, 5.0, lane)
    task = await started(p)
    p.body(b"a\n")
    assert await task == "done"
    assert texts(delivered) == ["!failed: RuntimeError"]
    assert lines.failures == [("RuntimeError", False)]
    assert source.sink is None


def _scrub(value: object) -> object:
    """An event as a comparable value: ids, times and sequence-free of per-response values."""
    if isinstance(value, dict):
        return {
            k: _scrub(v)
            for k, v in value.items()
            if k not in {"id", "item_id", "created_at", "completed_at"}
        }
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_an_agent_sdk_gets_the_same_stream_with_the_lane_as_without(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, surface: str
) -> None:
    import anthropic
    import openai

    lane = LaneWatch(monkeypatch, translated=True)

    def stream() -> tuple[list[object], str]:
        if surface == "responses":
            with openai.OpenAI(
                base_url=f"{gateway.url}/v1", api_key=gateway.key, max_retries=0
            ) as client:
                events = list(client.responses.create(model=MODEL, input="hello", stream=True))
                text = events[-1].response.output_text  # type: ignore[union-attr]
                return [_scrub(event.model_dump()) for event in events], text
        with (
            anthropic.Anthropic(base_url=gateway.url, api_key=gateway.key, max_retries=0) as ac,
            ac.messages.stream(
                model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hello"}]
            ) as events,
        ):
            seen = [_scrub(event.model_dump()) for event in events]
            final = events.get_final_message().content
            return seen, "".join(block.text for block in final if block.type == "text")

    laned, text = stream()
    assert lane.taken  # the lane relayed the tokens after the first
    assert text
    lane.enabled = False
    assert stream() == (laned, text)

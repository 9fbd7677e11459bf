"""The one watcher for a client going away while its answer is prepared or streamed.

Used by every response that relays an upstream answer: the generation engine's
(`gateway.relay.response.RelayResponse`) and the Ollama surface's progress streams
(`gateway.api.ollama.passthrough.ProgressResponse`). It listens for `http.disconnect` itself,
whatever ASGI spec version the server reports (Starlette only listens below 2.4), and cancels
the request's cancel scope: a client that goes away cancels the upstream request at once, even
while the upstream is silent (field failure F-13).

The watcher is a plain asyncio task, cancelled when the request ends, not an anyio task group:
the group's bookkeeping cost about 30 µs per request (docs/performance.md), and nothing waits
for the watcher's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio
from starlette.types import Receive


def watch_disconnect(
    receive: Receive, scope: anyio.CancelScope, gone: Callable[[], None]
) -> asyncio.Task[None]:
    """Start watching for the client leaving; cancel the returned task when the request ends.

    Args:
        receive: The request's ASGI `receive`; its body must have been read already, so the
            next message can only be `http.disconnect`.
        scope: Cancelled when the client leaves.
        gone: Called when the client leaves, before `scope` is cancelled.
    """
    return asyncio.get_running_loop().create_task(_watch(receive, scope, gone))


async def _watch(receive: Receive, scope: anyio.CancelScope, gone: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    gone()
    scope.cancel()

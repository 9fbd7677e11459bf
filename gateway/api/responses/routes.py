"""The Responses API's routes: `POST /v1/responses` through the relay, and stored responses.

`POST /v1/responses` binds an `Endpoint` (the body translator and codec of
`gateway.api.responses`) to the one pipeline, so a Responses request has every generation
route's keys, allow-lists, limits, retries, failover, metrics (route label `/v1/responses`),
usage, tracing and access log.

With `GATEWAY_RESPONSES_STORE` on, the route also keeps responses (`gateway.api.responses.store`):
the relay reads the body (after the key's RPM and in-flight check) through `_Continued`, which
puts the stored conversation of `previous_response_id` before the new `input`; the route stores
the `response` object before the client receives its last bytes, so a next turn sent on its
receipt always finds it, on any replica.
`GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items` and `DELETE /v1/responses/{id}`
read and delete the key's own stored responses; another key's are 404.

Over ~300 lines for one reason: the routes of `/v1/responses` share one store and one rule, a key
reaches only its own responses: `POST` saves them (`_KeptBeforeEnd`) and loads the previous turn
(`_Continued`) from the same `ResponseStore` that `GET`, `input_items` and `DELETE` read.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.exc import SQLAlchemyError
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from gateway.api.auth import PrincipalDep, require_principal
from gateway.api.responses.codec import ResponsesCodec
from gateway.api.responses.schema import parse_responses
from gateway.api.responses.store import ResponseStore, with_ids
from gateway.auth.principal import Principal
from gateway.deps import (
    KeysDep,
    RelayDep,
    SettingsDep,
    get_authenticator,
    get_keys,
    get_relay,
    get_settings,
)
from gateway.errors import NotFoundError, PayloadTooLargeError, UnprocessableError
from gateway.keys.store import KeyStore
from gateway.neutral import GenerationRequest
from gateway.relay.surface import Codec
from gateway.settings import Settings
from gateway.upstream.dialects.json_codec import encode_json
from gateway.wire.body import read_body
from gateway.wire.json import (
    INLINE_PARSE_BYTES,
    json_thread_limiter,
    parse_object,
    parse_request_body,
)

logger = logging.getLogger("gateway.responses")


@dataclass(frozen=True, slots=True)
class Responses:
    """`/v1/responses`: a Responses body as a chat request, the answer as Responses events."""

    route: str = "/v1/responses"

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Check and translate the body (`gateway.api.responses.schema.parse_responses`)."""
        return parse_responses(raw, settings)

    def codec(self, request: GenerationRequest) -> Codec:
        """SSE events, or one `response` object."""
        return ResponsesCodec(request)


@dataclass(slots=True)
class _Kept:
    """One request's endpoint when its response is to be stored: it keeps its codec."""

    #: These three are set when the body is read (`_Continued.receive`), before `parse`.
    store: bool = False
    previous_response_id: str | None = None
    items: list[Any] = field(default_factory=list)
    route: str = "/v1/responses"
    made: ResponsesCodec | None = field(default=None)

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        request = parse_responses(raw, settings)
        plan = dataclasses.replace(
            request.plan, store=self.store, previous_response_id=self.previous_response_id
        )
        return dataclasses.replace(request, plan=plan)

    def codec(self, request: GenerationRequest) -> Codec:
        self.made = ResponsesCodec(request)
        return self.made


def _store(settings: Settings, keys: KeyStore) -> ResponseStore:
    return ResponseStore(
        keys.engine,
        retention_seconds=settings.responses_retention_seconds,
        max_bytes=settings.responses_max_bytes_per_key,
    )


async def create_response(request: Request) -> Response:
    """`POST /v1/responses`: relayed; with the store on, continued and kept (module docstring).

    With the store on, the relay reads the body through `_Continued`: the key's RPM and
    in-flight limits come first, as for every generation (`gateway.relay.admission`), and only
    then is the body read, parsed and its `previous_response_id` looked up.

    Raises:
        NotFoundError: `previous_response_id` names no unexpired response of this key.
        UnprocessableError: `previous_response_id` not a string.
        GatewayError: whatever the relay refuses (`gateway.relay.pipeline`).
    """
    principal = await require_principal(request, await get_authenticator(request))
    relay = await get_relay(request)
    settings = await get_settings(request)
    if not settings.responses_store:
        return await relay.handle(request, principal, STATELESS)
    store = _store(settings, await get_keys(request))
    endpoint = _Kept()
    continued = _Continued(request, settings, store, principal, endpoint)
    response = await relay.handle(Request(request.scope, continued.receive), principal, endpoint)
    if not endpoint.store:
        return response
    return _KeptBeforeEnd(response, endpoint, store, principal, endpoint.items)


def _object(raw: bytes, settings: Settings) -> dict[str, Any]:
    return parse_object(raw, max_depth=settings.max_json_depth, max_values=settings.max_json_values)


@dataclass(slots=True)
class _Continued:
    """The client's body as the relay reads it: the stored conversation put before its input.

    The relay reads the body (`receive`'s first message) only once the key is admitted; so
    the read, the parse and the database lookup count against the key's limits. Before, they
    ran ahead of the RPM check: a key over its limit still had every body it sent read,
    parsed on the event loop and looked up (found by an attacking review).
    """

    request: Request
    settings: Settings
    store: ResponseStore
    principal: Principal
    endpoint: _Kept
    expanded: bool = False

    async def receive(self) -> Message:
        """The expanded body, as one message; then the client's own messages (a disconnect).

        Raises:
            NotFoundError, UnprocessableError: as `create_response`.
            PayloadTooLargeError: the body grown by the stored conversation is over
                `GATEWAY_MAX_BODY_BYTES` (413, naming `previous_response_id`).
            GatewayError: the body's size or syntax (`read_body`, `parse_object`).
        """
        if self.expanded:
            return await self.request.receive()
        self.expanded = True
        raw = await read_body(self.request, self.settings.max_body_bytes)
        body = await parse_request_body(_object, raw, self.settings)
        previous = body.pop("previous_response_id", None)
        earlier: list[Any] = []
        if previous is not None:
            if not isinstance(previous, str):
                raise UnprocessableError("previous_response_id must be a string")
            stored = await self.store.load(self.principal.key_id, previous)
            if stored is None:
                raise NotFoundError(f"Previous response with id '{previous}' not found.")
            earlier = stored.conversation()
        given = body.get("input")
        if isinstance(given, str):
            given = [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": given}],
                }
            ]
        keep = body.get("store") is not False
        if isinstance(given, list):
            given = with_ids(given) if keep else given
            body["input"] = [*earlier, *given]
        self.endpoint.store = keep
        self.endpoint.previous_response_id = previous
        self.endpoint.items = body.get("input") or []
        if earlier or len(raw) > INLINE_PARSE_BYTES:  # a body's worth: off the event loop
            merged = await anyio.to_thread.run_sync(
                encode_json, body, limiter=json_thread_limiter()
            )
        else:
            merged = encode_json(body)
        limit = self.settings.max_body_bytes
        if earlier and len(merged) > limit:  # the relay's read would say only "body too large"
            raise PayloadTooLargeError(
                f"the conversation of previous_response_id with this input is larger than "
                f"{limit} bytes (GATEWAY_MAX_BODY_BYTES): start a new conversation"
            )
        return {"type": "http.request", "body": merged, "more_body": False}


class _KeptBeforeEnd(Response):
    """The relay's response, its stored copy written before its last body message is sent."""

    def __init__(
        self,
        inner: Response,
        endpoint: _Kept,
        store: ResponseStore,
        principal: Principal,
        items: list[Any],
    ) -> None:
        # Not Response.__init__: this only wraps `inner` (its status and headers are its own).
        self.inner = inner
        self.status_code = inner.status_code
        self.background = None
        self._endpoint = endpoint
        self._store = store
        self._principal = principal
        self._items = items
        self._saved = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_kept(message: Message) -> None:
            if message["type"] == "http.response.body" and not self._saved:
                codec = self._endpoint.made
                if codec is not None and codec.final is not None:
                    self._saved = True
                    await self._keep(codec.final)
            await send(message)

        await self.inner(scope, receive, send_kept)

    async def _keep(self, final: dict[str, Any]) -> None:
        """Store the answer; a database failure is logged and the answer still delivered."""
        try:
            await self._store.save(self._principal.key_id, final, self._items)
        except (SQLAlchemyError, OSError) as exc:
            logger.warning(
                "could not store response %s of key %s: %s",
                final.get("id"),
                self._principal.key_id,
                type(exc).__name__,
            )


STATELESS = Responses()

generation_routes = [Route("/v1/responses", create_response, methods=["POST"])]
"""The Responses generation route, mounted by `create_app` beside the OpenAI ones."""

router = APIRouter(prefix="/v1/responses", dependencies=[Depends(require_principal)])


async def _stored(
    response_id: str, principal: Principal, settings: Settings, keys: KeyStore
) -> Any:
    if not settings.responses_store:
        raise NotFoundError("stored responses are off on this gateway (GATEWAY_RESPONSES_STORE)")
    stored = await _store(settings, keys).load(principal.key_id, response_id)
    if stored is None:
        raise NotFoundError(f"Response with id '{response_id}' not found.")
    return stored


@router.get("/{response_id}")
async def get_response(
    response_id: str,
    principal: PrincipalDep,
    settings: SettingsDep,
    keys: KeysDep,
    relay: RelayDep,
) -> dict[str, Any]:
    """The key's stored `response` object.

    Raises:
        NotFoundError: none of this key's unexpired responses has that id, or the store is off.
    """
    async with relay.limiter.admitted(principal):
        stored = await _stored(response_id, principal, settings, keys)
    return dict(stored.response)


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    principal: PrincipalDep,
    settings: SettingsDep,
    keys: KeysDep,
    relay: RelayDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> dict[str, Any]:
    """The input the response answered, earlier turns included: OpenAI's list shape.

    `order` `desc` (OpenAI's default) lists the newest item first; `after` an item id pages on.

    Raises:
        NotFoundError: as `get_response`.
    """
    async with relay.limiter.admitted(principal):
        stored = await _stored(response_id, principal, settings, keys)
    items = stored.items if order == "asc" else stored.items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(items) > limit,
    }


@router.delete("/{response_id}")
async def delete_response(
    response_id: str,
    principal: PrincipalDep,
    settings: SettingsDep,
    keys: KeysDep,
    relay: RelayDep,
) -> dict[str, Any]:
    """Delete the key's stored response: `{"id", "object": "response", "deleted": true}`.

    Raises:
        NotFoundError: as `get_response`.
    """
    if not settings.responses_store:
        raise NotFoundError("stored responses are off on this gateway (GATEWAY_RESPONSES_STORE)")
    async with relay.limiter.admitted(principal):
        deleted = await _store(settings, keys).delete(principal.key_id, response_id)
    if not deleted:
        raise NotFoundError(f"Response with id '{response_id}' not found.")
    return {"id": response_id, "object": "response", "deleted": True}

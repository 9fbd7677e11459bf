"""The Anthropic Messages API's routes: `/v1/messages` through the relay, and `count_tokens`.

`POST /v1/messages` binds `Messages` (the translation of `gateway.api.anthropic.schema` and the
codec of `gateway.api.anthropic.codec`) to the one relay pipeline: keys, allow-lists, RPM, TPM
and in-flight limits, retries, failover, metrics (route `/v1/messages`), usage, tracing and the
access log are every other generation route's. The query string (`?beta=true`, which Claude
Code adds) and the `anthropic-version` / `anthropic-beta` headers are accepted whatever their
value (../shared/reference/agent-clients.md, "Claude Code").

`POST /v1/messages/count_tokens` answers `{"input_tokens": N}` with the gateway's own estimate
(`gateway.limits.estimate`: UTF-8 bytes of the translated prompt / 4), marked by the response
header `X-Gateway-Token-Count: estimate`: neither upstream dialect has a way to count without
generating that every engine serves. It counts against the key's RPM and in-flight limit and
allow-list, never its TPM (it makes the upstream do no work).

Every error on these paths, unknown subpaths included, is in Anthropic's shape
(`gateway.errors.error_response`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gateway.api.anthropic.codec import MessagesCodec
from gateway.api.anthropic.schema import parse_body, parse_messages, to_chat_body
from gateway.api.auth import PrincipalDep, require_principal
from gateway.api.openai.schema import openai_generation
from gateway.api.relayed import relayed
from gateway.context import request_context
from gateway.deps import RelayDep
from gateway.errors import BadRequestError, UnprocessableError
from gateway.limits.estimate import estimate_tokens
from gateway.neutral import GenerationRequest
from gateway.relay.admission import admitted, aliased, asked_model
from gateway.relay.surface import Codec
from gateway.settings import Settings

#: The header that says `count_tokens` answered with an estimate, and its value.
COUNT_HEADER = "X-Gateway-Token-Count"


@dataclass(frozen=True, slots=True)
class Messages:
    """`/v1/messages` (Messages API reference, "Create a Message")."""

    route: str = "/v1/messages"

    def parse(self, raw: bytes, settings: Settings) -> GenerationRequest:
        """Translate and check the body (`gateway.api.anthropic.schema.parse_messages`)."""
        return parse_messages(raw, settings)

    def codec(self, request: GenerationRequest) -> Codec:
        """Anthropic's SSE events, or one `message` object."""
        return MessagesCodec(request)


generation_routes = [relayed("/v1/messages", Messages())]
"""The Messages generation route, mounted by `create_app` beside the OpenAI ones."""

router = APIRouter(prefix="/v1/messages", dependencies=[Depends(require_principal)])


def parse_count(raw: bytes, settings: Settings) -> GenerationRequest:
    """A `count_tokens` body (a Messages body; `max_tokens` not required) as a chat request.

    Raises:
        BadRequestError: as `parse_messages`.
    """
    body = parse_body(raw, settings)
    chat = to_chat_body({**body, "stream": False}, counting=True)
    try:
        request = openai_generation(chat, "chat", len(raw))
    except UnprocessableError as exc:
        raise BadRequestError(exc.message) from None
    return aliased(request, settings)  # the allow-list checks the model that would run


def _model(request: GenerationRequest) -> list[str]:
    return [request.model]


@router.post("/count_tokens")
async def count_tokens(request: Request, principal: PrincipalDep, relay: RelayDep) -> JSONResponse:
    """`{"input_tokens": N}`, an estimate (module docstring); RPM and allow-list apply.

    Raises:
        BadRequestError: the body's shape (400).
        ForbiddenError: a model off the key's allow-list (403).
        RateLimitedError, ServiceUnavailableError: the key's RPM or in-flight limit.
    """
    context = request_context(request.scope)
    async with admitted(
        relay.limiter,
        relay.settings,
        principal,
        request,
        parse_count,
        _model,
        context=context,
        asked=asked_model,
    ) as ticket:
        tokens = estimate_tokens(ticket.body, 0).prompt
    answer: dict[str, Any] = {"input_tokens": tokens}
    return JSONResponse(answer, headers={COUNT_HEADER: "estimate"})

"""The admin API, `/admin/v1`: keys, their usage, and the audit trail (docs/admin.md).

Each route is a thin front end to the same `KeyStore` operation the CLI calls (one
implementation, two front ends): the store validates, changes the key and writes the audit entry
in one transaction; the route turns its errors into HTTP ones and records the caller as the
actor (the token's subject and the client's address). A change made here is applied to this
replica's key cache at once and reaches other replicas within `GATEWAY_KEY_CACHE_SECONDS`.

Over ~300 lines for one reason: the routes of one router, `/admin/v1`, each a few lines in front of
one `KeyStore` operation under the same token check, scopes, error table and body limit; split by
resource (keys, usage, audit), each part would repeat that router for about a hundred lines of
routes.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from gateway import __version__
from gateway.api.admin import live
from gateway.api.admin.auth import AdminDep, ReaderDep, get_verifier
from gateway.api.admin.body import BoundedBodyRoute
from gateway.api.admin.schemas import (
    MAX_PAGE,
    Audit,
    AuditPage,
    ErrorBody,
    Key,
    KeyCreate,
    KeyPage,
    KeyRotate,
    KeyUpdate,
    KeyWithSecret,
)
from gateway.deps import AuthenticatorDep, KeysDep
from gateway.errors import NotFoundError, UnprocessableError
from gateway.keys.audit import ACTIONS
from gateway.keys.schema import KeyStatus
from gateway.keys.store import InvalidKeyError, KeyNotFoundError, KeyStore
from gateway.metering.report import read_usage

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in (
        (401, "No valid admin token"),
        (403, "The token lacks the scope"),
        (404, "No such key"),
        (422, "Invalid body, query or cursor"),
        (429, "Too many failed authentications from this address"),
    )
}
router = APIRouter(
    prefix="/admin/v1",
    responses=_ERRORS,
    dependencies=[Depends(get_verifier)],
    tags=["admin"],
    route_class=BoundedBodyRoute,  # the token checked first, then the body read within a limit
)

PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE)]
#: The usage window when none is given (as `gateway keys usage`), and the longest one.
DEFAULT_USAGE_DAYS = 30
MAX_USAGE_DAYS = 366


@router.post("/keys", status_code=201)
async def create_key(body: KeyCreate, store: KeysDep, actor: AdminDep) -> KeyWithSecret:
    """Create a key; the response holds its secret, shown this once."""
    try:
        record, secret = await store.create_key(
            body.name,
            models=body.models,
            expires_at=body.expires_at,
            rpm=body.rpm,
            tpm=body.tpm,
            max_concurrent=body.max_concurrent,
            manage_models=body.manage_models,
            actor=actor,
        )
    except ValueError as exc:
        raise UnprocessableError(str(exc)) from None
    return KeyWithSecret(key=Key.of(record), secret=secret)


@router.get("/keys")
async def list_keys(
    store: KeysDep,
    _: ReaderDep,
    status: KeyStatus | None = None,
    name: Annotated[str | None, Query(max_length=200)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    limit: PageSize = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> KeyPage:
    """List keys, oldest first, filtered by status, name (contains) and model (may use)."""
    after = None if cursor is None else _key_cursor(cursor)
    records = await store.list_keys(
        status=status, name=name, model=model, after=after, limit=limit + 1
    )
    page = records[:limit]
    next_cursor = None
    if len(records) > limit:
        last = page[-1]
        next_cursor = _encode([last.created_at.isoformat(), last.id])
    return KeyPage(data=[Key.of(record) for record in page], next_cursor=next_cursor)


@router.get("/keys/{key_id}")
async def get_key(key_id: str, store: KeysDep, _: ReaderDep) -> Key:
    """One key."""
    try:
        return Key.of(await store.get_key(key_id))
    except KeyNotFoundError:
        raise NotFoundError(f"no API key with id {key_id!r}") from None


@router.patch("/keys/{key_id}")
async def update_key(
    key_id: str, body: KeyUpdate, store: KeysDep, cache: AuthenticatorDep, actor: AdminDep
) -> Key:
    """Change a key's name, models, expiry, limits or permission (only the fields sent)."""
    try:
        record = await store.update(key_id, **body.changes(), actor=actor)
    except KeyNotFoundError:
        raise NotFoundError(f"no API key with id {key_id!r}") from None
    except ValueError as exc:
        raise UnprocessableError(str(exc)) from None
    cache.forget(key_id)
    return Key.of(record)


@router.post("/keys/{key_id}/revoke")
async def revoke_key(key_id: str, store: KeysDep, cache: AuthenticatorDep, actor: AdminDep) -> Key:
    """Revoke a key for good (again: no change)."""
    try:
        record = await store.revoke(key_id, actor=actor)
    except KeyNotFoundError:
        raise NotFoundError(f"no API key with id {key_id!r}") from None
    cache.forget(key_id)
    return Key.of(record)


@router.post("/keys/{key_id}/rotate")
async def rotate_key(
    key_id: str,
    store: KeysDep,
    cache: AuthenticatorDep,
    actor: AdminDep,
    body: KeyRotate | None = None,
) -> KeyWithSecret:
    """Give a key a new secret (shown once); the old one works for `grace_seconds` more."""
    grace = timedelta(seconds=0 if body is None else body.grace_seconds)
    try:
        record, secret = await store.rotate(key_id, grace=grace, actor=actor)
    except KeyNotFoundError:
        raise NotFoundError(f"no API key with id {key_id!r}") from None
    except InvalidKeyError:
        raise UnprocessableError(f"key {key_id} is revoked; create a new one") from None
    cache.forget(key_id)
    return KeyWithSecret(key=Key.of(record), secret=secret)


@router.get("/usage")
async def usage(
    store: KeysDep,
    _: ReaderDep,
    key_id: Annotated[str | None, Query(max_length=32)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    since: date | None = None,
    until: date | None = None,
) -> dict[str, Any]:
    """Usage per key, model and UTC day, with totals (`since`/`until`: inclusive UTC days)."""
    return await _usage(store, key_id=key_id, model=model, since=since, until=until)


@router.get("/keys/{key_id}/usage")
async def key_usage(
    key_id: str,
    store: KeysDep,
    _: ReaderDep,
    model: Annotated[str | None, Query(max_length=200)] = None,
    since: date | None = None,
    until: date | None = None,
) -> dict[str, Any]:
    """One key's usage per model and UTC day, with totals."""
    try:
        await store.get_key(key_id)
    except KeyNotFoundError:
        raise NotFoundError(f"no API key with id {key_id!r}") from None
    return await _usage(store, key_id=key_id, model=model, since=since, until=until)


async def _usage(
    store: KeyStore,
    *,
    key_id: str | None,
    model: str | None,
    since: date | None,
    until: date | None,
) -> dict[str, Any]:
    """Read usage in a window: by default the last 30 days, at most `MAX_USAGE_DAYS` long."""
    until = until or datetime.now(UTC).date()
    try:
        since = since or until - timedelta(days=DEFAULT_USAGE_DAYS - 1)
    except OverflowError:  # a default window that would start before year 1
        raise UnprocessableError("until is too early: give since as well") from None
    if since > until:
        raise UnprocessableError("since must not be after until")
    if (until - since).days >= MAX_USAGE_DAYS:
        raise UnprocessableError(f"ask for at most {MAX_USAGE_DAYS} days at once")
    report = await read_usage(store.engine, key_id=key_id, model=model, since=since, until=until)
    return {
        "object": "usage",
        "since": since.isoformat(),
        "until": until.isoformat(),
        **report.to_json(),
    }


@router.get("/audit")
async def list_audit(
    store: KeysDep,
    _: ReaderDep,
    key_id: Annotated[str | None, Query(max_length=32)] = None,
    actor: Annotated[str | None, Query(max_length=200)] = None,
    action: Annotated[list[str] | None, Query()] = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: PageSize = 100,
    cursor: Annotated[str | None, Query(max_length=40)] = None,
) -> AuditPage:
    """The audit trail, oldest first, filtered by key, actor, action and time."""
    if action is not None and not set(action) <= set(ACTIONS):
        raise UnprocessableError(f"action must be one of {', '.join(ACTIONS)}")
    # ASCII digits (`isdigit` alone takes other scripts' digits), within a 64-bit id.
    if cursor is not None and not (cursor.isascii() and cursor.isdigit() and int(cursor) < 2**63):
        raise UnprocessableError("invalid cursor")
    entries = await store.list_audit(
        key_id=key_id,
        actor=actor,
        actions=action,
        since=_aware(since),
        until=_aware(until),
        after_id=None if cursor is None else int(cursor),
        limit=limit + 1,
    )
    page = entries[:limit]
    next_cursor = str(page[-1].id) if len(entries) > limit else None
    return AuditPage(data=[Audit.of(entry) for entry in page], next_cursor=next_cursor)


router.include_router(live.router)  # whoami, models, live: the same token check and document


@router.get("/openapi.json", include_in_schema=False)
async def openapi(_: ReaderDep) -> JSONResponse:
    """This API's OpenAPI document (admin tokens only: it maps the admin surface)."""
    document = get_openapi(
        title="LLM gateway admin API",
        version=__version__,
        routes=router.routes,
        description="Keys, usage, audit and the live view of an LLM gateway (docs/admin.md).",
    )
    document.setdefault("components", {})["securitySchemes"] = {
        "adminToken": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
    }
    document["security"] = [{"adminToken": []}]
    return JSONResponse(document)


def _aware(moment: datetime | None) -> datetime | None:
    """A time from a query string, in UTC; one without a zone is taken as UTC (docs say so).

    Raises:
        UnprocessableError: if the time in UTC is outside years 1 to 9999.
    """
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise UnprocessableError("time out of range") from None


def _encode(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _key_cursor(cursor: str) -> tuple[datetime, str]:
    """Decode a `KeyPage.next_cursor`.

    Raises:
        UnprocessableError: if it is not one this API made.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, key_id = json.loads(raw)
        moment = datetime.fromisoformat(created_at)
        if not isinstance(key_id, str) or moment.tzinfo is None:
            raise ValueError(cursor)
        moment = moment.astimezone(UTC)  # OverflowError out of range: no cursor made that
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise UnprocessableError("invalid cursor") from None
    return moment, key_id

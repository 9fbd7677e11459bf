"""The gateway's tables, declared once for SQLite and PostgreSQL alike.

- `gateway_api_keys` (`ApiKeyRow`): API keys, hashes only; read and written by `gateway.keys.store`.
- `gateway_usage` (`UsageRow`): per key, model and UTC day, what the key used; added to in
  batches by the usage sink, never rewritten.
- `gateway_audit` (`AuditRow`): one append-only row per admin action.
- `gateway_files` (`FileRow`), `gateway_batches` (`BatchRow`), `gateway_batch_lines`
  (`BatchLineRow`) and `gateway_batch_events` (`BatchEventRow`): the OpenAI Batch API's files,
  batches, each input line's state and result, and each batch's own log (`gateway.batch`).
- `gateway_responses` (`ResponseRow`): stored Responses API answers and their input, when
  `GATEWAY_RESPONSES_STORE` is on (`gateway.api.responses.store`).

Times are UTC: `UTCDateTime` converts on the way in and makes every value read back
timezone-aware, because SQLite keeps no zone and returns naive datetimes. The migrations in
`gateway.db.migrations` create and upgrade these tables; a change here needs a migration there.

Over ~300 lines for one reason: every table is declared on one `Base.metadata`, the schema the
migrations in `gateway.db.migrations` must produce, and each row class is only its columns and
constraints; one file is where a reader sees the whole schema and its shared `UTCDateTime`.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def as_utc(moment: datetime | None) -> datetime:
    """Return `moment` (default: now) as an aware UTC datetime.

    Raises:
        ValueError: if `moment` is naive, since its zone would be a guess.
    """
    if moment is None:
        return datetime.now(UTC)
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"naive datetime {moment!r}: pass a timezone-aware one")
    return moment.astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """`DateTime(timezone=True)` that accepts only aware datetimes and returns UTC-aware ones.

    On SQLite the value is stored as UTC text with microseconds (a fixed-width format, so SQL
    comparisons such as `last_used_at <= :cutoff` order correctly); on PostgreSQL as `timestamptz`.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(
        self,
        value: datetime | None,
        dialect: Dialect,  # noqa: ARG002 (SQLAlchemy's signature)
    ) -> datetime | None:
        """Convert an aware datetime to UTC before it is stored.

        Raises:
            ValueError: if `value` is naive.
        """
        return None if value is None else as_utc(value)

    def process_result_value(
        self,
        value: datetime | None,
        dialect: Dialect,  # noqa: ARG002 (SQLAlchemy's signature)
    ) -> datetime | None:
        """Return the stored time as an aware UTC datetime (SQLite's are naive, and UTC)."""
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base whose metadata holds every gateway table."""


class ApiKeyRow(Base):
    """One API key. The secret itself is never stored, only `sha256(secret)` as hex."""

    __tablename__ = "gateway_api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    secret_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    # A JSON list of model names; SQL NULL (not JSON `null`) means every model.
    models: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Per-key limits: NULL = the gateway's default (settings), 0 = unlimited, n > 0 = the limit.
    rpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tpm: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_concurrent: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # May the key use Ollama's model-management endpoints (pull, push, create, copy, delete,
    # blobs)? NULL = no: nullable because tables older than the permission got it added
    # (migration 0001 adopts them), and their keys stay ordinary keys.
    manage_models: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # Rotation with a grace period: the secret before the last rotation still opens the key
    # until `previous_secret_expires_at` (both NULL when there is none).
    previous_secret_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(
        UTCDateTime(), nullable=True
    )


class UsageRow(Base):
    """What one key used of one model on one UTC day. Rows are only ever added to.

    Durations are sums of whole microseconds, so that additions from several replicas, in any
    order, give exactly the same total (floating-point sums would not).
    """

    __tablename__ = "gateway_usage"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    # Requests that produced a first token, and the sum of their TTFTs.
    ttft_count: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    ttft_us_sum: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    # Sum of arrival-to-end durations of the requests that reached an upstream.
    generation_us_sum: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)

    __table_args__ = (Index("ix_gateway_usage_day", "day"),)


class AuditRow(Base):
    """One admin action: who did what to which key, when, from where. Never updated or deleted.

    `changes` maps each changed field to `{"before": ..., "after": ...}`; it never holds a
    secret or a secret's hash.
    """

    __tablename__ = "gateway_audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    actor: Mapped[str] = mapped_column(String(200), nullable=False)
    action: Mapped[str] = mapped_column(String(40), nullable=False)
    key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    source: Mapped[str | None] = mapped_column(String(100), nullable=True)
    changes: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)

    __table_args__ = (
        Index("ix_gateway_audit_at", "at"),
        Index("ix_gateway_audit_key_id", "key_id"),
    )


class FileRow(Base):
    """One file of the Files API: a batch's input, or the output or error file it produced.

    `content` holds the bytes when files live in the database (the default); with
    `GATEWAY_BATCH_STORAGE_DIR` set it is NULL and the bytes are in that directory, named by id.
    """

    __tablename__ = "gateway_files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), nullable=False)
    filename: Mapped[str] = mapped_column(String(255), nullable=False)
    purpose: Mapped[str] = mapped_column(String(20), nullable=False)
    size: Mapped[int] = mapped_column("bytes", BigInteger, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    # Deferred, and raising if touched unasked: a listing or a metadata read must never load
    # every file's bytes (ten listings of 10 x 20 MiB files took 7.2 GB before). The bytes are
    # read in ranges by `gateway.batch.files.FileStore.content`.
    content: Mapped[bytes | None] = mapped_column(
        LargeBinary, nullable=True, deferred=True, deferred_raiseload=True
    )

    __table_args__ = (Index("ix_gateway_files_key_id", "key_id", "created_at"),)


class BatchRow(Base):
    """One batch: its input, its state, its per-state times and, once ended, its result files.

    `status` is OpenAI's (`in_progress`, `finalizing`, `completed`, `failed`, `expired`,
    `cancelling`, `cancelled`); the line counts are not stored here but counted from
    `gateway_batch_lines`, so they can never disagree with the lines.
    """

    __tablename__ = "gateway_batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), nullable=False)
    endpoint: Mapped[str] = mapped_column(String(40), nullable=False)
    input_file_id: Mapped[str] = mapped_column(String(40), nullable=False)
    completion_window: Mapped[str] = mapped_column(String(10), nullable=False)
    status: Mapped[str] = mapped_column(String(20), nullable=False)
    batch_metadata: Mapped[dict[str, str] | None] = mapped_column(
        "metadata", JSON(none_as_null=True), nullable=True
    )
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(
        JSON(none_as_null=True), nullable=True
    )
    total: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    output_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    error_file_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        Index("ix_gateway_batches_key_id", "key_id", "created_at"),
        Index("ix_gateway_batches_status", "status"),
    )


class BatchLineRow(Base):
    """One input line of a batch: its request, its state, its lease and its result.

    `state` is `pending`, `running` (claimed by `lease_owner` until `lease_expires`),
    `succeeded` or `failed`; a line ends in exactly one of the last two, and the output or the
    error file is written from these rows, so each `custom_id` appears there once.
    """

    __tablename__ = "gateway_batch_lines"

    batch_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(512), nullable=False)
    model: Mapped[str] = mapped_column(String(200), nullable=False)
    body: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    state: Mapped[str] = mapped_column(String(10), nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(40), nullable=True)
    lease_expires: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    request_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    result: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(40), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        Index("ix_gateway_batch_lines_state", "state", "batch_id"),
        # A claim reads a batch's first pending lines in this order, not the whole queue.
        Index("ix_gateway_batch_lines_claim", "batch_id", "state", "model", "line_no"),
    )


class BatchEventRow(Base):
    """One entry of a batch's own log: an attempt that failed, a retry, a state change.

    Kept apart from the access log. `message` is the gateway's or the upstream's error text
    (bounded, never a prompt or a key).
    """

    __tablename__ = "gateway_batch_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(String(40), nullable=False)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    event: Mapped[str] = mapped_column(String(20), nullable=False)
    line_no: Mapped[int | None] = mapped_column(Integer, nullable=True)
    custom_id: Mapped[str | None] = mapped_column(String(512), nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (Index("ix_gateway_batch_events_batch", "batch_id", "id"),)


class ResponseRow(Base):
    """One stored answer of the Responses API (`GATEWAY_RESPONSES_STORE`), owned by its key.

    `items` is the JSON text of the whole input the response answered (earlier turns included,
    each item with an `id`), `response` the JSON text of the `response` object; `size` their
    bytes, which the per-key cap counts. Rows past `expires_at` are never read and are deleted
    when the next response is stored.
    """

    __tablename__ = "gateway_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(32), nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    size: Mapped[int] = mapped_column("bytes", BigInteger, nullable=False)
    items: Mapped[str] = mapped_column(Text, nullable=False)
    response: Mapped[str] = mapped_column(Text, nullable=False)

    __table_args__ = (
        Index("ix_gateway_responses_key_id", "key_id", "created_at"),
        Index("ix_gateway_responses_expires_at", "expires_at"),
    )

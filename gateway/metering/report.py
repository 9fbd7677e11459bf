"""Reading usage back: `read_usage` returns `gateway_usage` rows and their totals.

One function for every front end: `gateway keys usage` (`gateway.keys.usage_cli`) and the
admin API. Each row carries the key's name as the key store has it now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db.tables import ApiKeyRow, UsageRow
from gateway.metering.counting import COLUMNS, UNKNOWN_MODEL, canonical_model


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Summed usage (see docs/keys.md, "Usage", for what each number counts).

    Attributes:
        requests: Requests made with the key (relayed, or refused after authentication).
        errors: Those that did not complete (a client that left is not an error).
        input_tokens: Prompt tokens, as the client was told (`prompt_eval_count`, `usage`).
        output_tokens: Output tokens, as the client was told; for a stream cut short, the
            chunks sent.
        ttft_count: Requests that sent a first token.
        ttft_us_sum: Their times to first token, summed, microseconds.
        generation_us_sum: Durations (arrival to end) of the requests sent upstream, summed,
            microseconds.
    """

    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    ttft_count: int = 0
    ttft_us_sum: int = 0
    generation_us_sum: int = 0

    @property
    def mean_ttft_s(self) -> float | None:
        """Mean time to first token, seconds; None when no request sent a first token."""
        return self.ttft_us_sum / self.ttft_count / 1e6 if self.ttft_count else None

    def to_json(self) -> dict[str, Any]:
        """The counts plus `mean_ttft_s`, as JSON-ready values."""
        return {**{name: getattr(self, name) for name in COLUMNS}, "mean_ttft_s": self.mean_ttft_s}


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One key's usage of one model on one UTC day.

    Attributes:
        day: The UTC date the requests arrived on.
        key_id: The key's id.
        key_name: Its name now; None if the key is no longer in the store.
        model: The model the client asked for (an alias's target), canonical, or `-`
            for requests refused before their body named one.
        totals: The day's sums.
    """

    day: date
    key_id: str
    key_name: str | None
    model: str
    totals: UsageTotals

    def to_json(self) -> dict[str, Any]:
        """A flat JSON object: `day` (ISO), `key_id`, `name`, `model` and the counts."""
        return {
            "day": self.day.isoformat(),
            "key_id": self.key_id,
            "name": self.key_name,
            "model": self.model,
            **self.totals.to_json(),
        }


@dataclass(frozen=True, slots=True)
class UsageReport:
    """The rows a query matched, ordered by day, key id and model, and their totals."""

    rows: list[UsageRecord]
    totals: UsageTotals

    def to_json(self) -> dict[str, Any]:
        """`{"rows": [...], "totals": {...}}`."""
        return {"rows": [row.to_json() for row in self.rows], "totals": self.totals.to_json()}


async def read_usage(
    engine: AsyncEngine,
    *,
    key_id: str | None = None,
    model: str | None = None,
    since: date | None = None,
    until: date | None = None,
) -> UsageReport:
    """Read usage rows and their totals.

    Args:
        engine: The database holding `gateway_usage` (the key store's).
        key_id: Only this key's rows.
        model: Only this model's rows; compared in canonical form, so `llama3.2` matches
            `llama3.2:latest` (and `-` the requests refused before naming a model).
        since: First UTC day included; None: no lower bound.
        until: Last UTC day included; None: no upper bound.

    Returns:
        The matching rows (day, key id, model order) and their sums.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database could not be read.
    """
    usage = UsageRow.__table__.c
    query = select(*usage, ApiKeyRow.name.label("key_name")).outerjoin(
        ApiKeyRow, ApiKeyRow.id == usage.key_id
    )
    if key_id is not None:
        query = query.where(UsageRow.key_id == key_id)
    if model is not None:
        # `-` (the requests refused before naming a model) is a row name, not a model name.
        wanted = model if model == UNKNOWN_MODEL else canonical_model(model)
        query = query.where(UsageRow.model == wanted)
    if since is not None:
        query = query.where(UsageRow.day >= since)
    if until is not None:
        query = query.where(UsageRow.day <= until)
    query = query.order_by(UsageRow.day, UsageRow.key_id, UsageRow.model)
    async with engine.connect() as connection:
        result = await connection.execute(query)
        rows = [
            UsageRecord(
                day=row.day,
                key_id=row.key_id,
                key_name=row.key_name,
                model=row.model,
                totals=UsageTotals(**{column: int(row._mapping[column]) for column in COLUMNS}),
            )
            for row in result
        ]
    sums = {column: sum(getattr(row.totals, column) for row in rows) for column in COLUMNS}
    return UsageReport(rows, UsageTotals(**sums))

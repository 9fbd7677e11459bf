"""Alembic's environment: run the migrations on the connection `gateway.db.migrate` passes in.

`gateway.db.migrate` opens the connection, takes the lock and owns the transaction; here the
migrations only join it (Alembic sees a transaction already begun and neither begins nor
commits one). There is no offline (`--sql`) mode and no URL of its own.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from gateway.db.migrations import VERSION_TABLE
from gateway.db.tables import Base

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError(
        "the gateway's migrations run through gateway.db.migrate (`gateway db upgrade`), "
        "which passes a connection in config.attributes['connection']"
    )
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    # SQLite alters little in place: later `batch_alter_table` revisions copy the table.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()

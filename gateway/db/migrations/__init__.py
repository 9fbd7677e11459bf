"""The Alembic migrations that create and upgrade the gateway's tables (`gateway.db.migrate`).

`env.py` runs them on the connection `gateway.db.migrate` hands over; `versions/` holds one
hand-written revision per schema change, in order (`0001`, `0002`, ...). They ship inside the
package, so an installed gateway upgrades its database without a checkout or an `alembic.ini`.
"""

from __future__ import annotations

VERSION_TABLE = "gateway_alembic_version"
"""Where Alembic records the database's revision: named for the gateway, so that another
application's Alembic history in the same database or schema (`alembic_version`) is left alone."""

SCRIPT_LOCATION = "gateway.db:migrations"
"""This directory, as Alembic's `script_location` (package-resource form: works from a wheel)."""

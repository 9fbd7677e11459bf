"""Metering: what each API key used, per model and UTC day, kept in the database.

`usage` adds up every finished request (`gateway.neutral.RequestSummary`) and every request
refused after authentication in memory, on the request path, and writes the sums in batches off
it; `report` reads them back for `gateway keys usage` and the admin API.
"""

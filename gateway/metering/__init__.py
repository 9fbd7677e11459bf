"""Metering: what each API key used, per model and UTC day, kept in the database.

`counting` says what one request adds (pure rules); `usage` adds up every finished request
(`gateway.neutral.RequestSummary`) and every request refused after authentication in memory, on
the request path, and writes the sums in batches off it; `report` reads them back for
`gateway keys usage` and the admin API.
"""

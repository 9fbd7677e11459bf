"""The OpenAI Responses API surface (`POST /v1/responses`), translated onto chat requests."""

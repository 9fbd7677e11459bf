"""The OpenAI Batch API surface: /v1/files and /v1/batches."""

"""Per-key limits (RPM, TPM, in-flight) and the per-upstream concurrency gate with its queue."""

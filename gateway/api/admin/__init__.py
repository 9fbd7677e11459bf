"""The admin surface: the `/admin/v1` API and the `gateway admin` commands."""

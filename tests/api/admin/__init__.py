"""Tests of `gateway/api/admin/`: the admin API over a real gateway and real processes."""

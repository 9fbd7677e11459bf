"""Tests of `gateway/wire/`.

Request bodies: bounded parsing, the body budget, parsing off the event loop.
"""

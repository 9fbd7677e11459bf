"""Settings: `.env.example` and docs/configuration.md list every setting, with its default."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def _example_values() -> dict[str, str]:
    text = (ROOT / ".env.example").read_text()
    return dict(re.findall(r"^(GATEWAY_[A-Z0-9_]+)=(.*)$", text, re.MULTILINE))


def test_env_example_lists_every_setting_with_its_default():
    example = _example_values()
    defaults = Settings(_env_file=None)
    assert set(example) == {f"GATEWAY_{name.upper()}" for name in Settings.model_fields}
    for name in Settings.model_fields:
        value = example[f"GATEWAY_{name.upper()}"]
        default = getattr(defaults, name)
        if default is None:
            assert value == "", name
        elif isinstance(default, bool):
            assert value == str(default).lower(), name
        elif isinstance(default, list):
            assert value in (json.dumps(default), ",".join(default)), name
        elif isinstance(default, dict):  # parsed as the variable is
            assert getattr(Settings(_env_file=None, **{name: value}), name) == default, name
        else:
            assert str(default).rstrip("/") == value.rstrip("/") or float(value) == default, name


def test_configuration_doc_names_every_setting():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    missing = [
        f"GATEWAY_{n.upper()}" for n in Settings.model_fields if f"GATEWAY_{n.upper()}" not in doc
    ]
    assert missing == []


def test_placeholder_upstream_secret_is_refused():
    with pytest.raises(ValidationError, match="placeholder"):
        Settings(_env_file=None, upstream_api_key="changeme")


def test_non_positive_timeouts_are_refused():
    with pytest.raises(ValidationError):
        Settings(_env_file=None, first_byte_timeout=0)


def test_several_upstreams_come_from_a_json_environment_variable(monkeypatch):
    upstreams = [
        {"url": "http://gpu-1:11434", "weight": 2},
        {"url": "http://gpu-2:8000", "dialect": "openai"},
    ]
    monkeypatch.setenv("GATEWAY_UPSTREAMS", json.dumps(upstreams))
    specs = Settings(_env_file=None).upstream_specs
    assert [(s.name, s.dialect, s.weight) for s in specs] == [
        ("gpu-1:11434", "ollama", 2.0),
        ("gpu-2:8000", "openai", 1.0),
    ]


def test_one_upstream_comes_from_the_single_upstream_settings():
    [spec] = Settings(
        _env_file=None, upstream_url="http://127.0.0.1:8000", upstream_dialect="openai"
    ).upstream_specs
    assert (spec.name, spec.dialect) == ("127.0.0.1:8000", "openai")


def test_a_misspelled_variable_is_named_not_silently_ignored() -> None:
    from gateway.settings import unknown_variables

    environ = {
        "GATEWAY_PROT": "9999",  # a typo of GATEWAY_PORT
        "GATEWAY_PORT": "8081",
        "gateway_log_levl": "debug",
        "GATEWAY_WHEEL_CACHE": "/cache",  # the scripts' own
        "HOME": "/root",
    }
    assert unknown_variables(environ) == ["GATEWAY_PROT", "gateway_log_levl"]


def test_cors_is_off_unless_origins_are_listed():
    assert Settings(_env_file=None).cors_origins == []


@pytest.mark.parametrize(
    "value",
    [
        "https://app.example.com, http://localhost:5173",
        '["https://app.example.com", "http://localhost:5173"]',
    ],
)
def test_cors_origins_come_comma_separated_or_as_a_json_list(monkeypatch, value: str):
    monkeypatch.setenv("GATEWAY_CORS_ORIGINS", value)
    origins = Settings(_env_file=None).cors_origins
    assert origins == ["https://app.example.com", "http://localhost:5173"]


def test_cors_origins_accept_star_and_ipv6_and_extension_origins(monkeypatch):
    monkeypatch.setenv("GATEWAY_CORS_ORIGINS", "*,http://[::1]:8000,chrome-extension://abcdef")
    assert Settings(_env_file=None).cors_origins == [
        "*",
        "http://[::1]:8000",
        "chrome-extension://abcdef",
    ]


@pytest.mark.parametrize(
    "origin",
    [
        "https://app.example.com/",  # a browser's Origin never ends in a slash
        "https://app.example.com/chat",
        "https://App.example.com",
        "app.example.com",
        "null",  # sent by sandboxed iframes and file: pages of any site
    ],
)
def test_cors_origins_refuse_what_no_browser_sends(monkeypatch, origin: str):
    monkeypatch.setenv("GATEWAY_CORS_ORIGINS", origin)
    with pytest.raises(ValidationError, match="is not an origin"):
        Settings(_env_file=None)


@pytest.mark.parametrize(
    ("value", "expected"), [("auto", "auto"), ("AUTO", "auto"), (" 3 ", 3), (2, 2)]
)
def test_the_worker_count_reads_numbers_and_auto_in_any_case(value, expected):
    assert Settings(workers=value).workers == expected


@pytest.mark.parametrize("value", ["two", "0", "-1", "1.5", "\u0663", 0])
def test_a_bad_worker_count_gets_one_clear_error(value):
    with pytest.raises(ValidationError) as caught:
        Settings(workers=value)
    assert caught.value.error_count() == 1
    assert "use 1 or more, or auto" in str(caught.value)


def test_an_otlp_endpoint_without_a_scheme_is_refused_at_start():
    with pytest.raises(ValidationError, match="not an http:// or https:// URL"):
        Settings(otel_exporter_otlp_endpoint="127.0.0.1:4318")
    assert Settings(otel_exporter_otlp_endpoint="").otel_exporter_otlp_endpoint is None
    url = Settings(otel_exporter_otlp_endpoint="http://collector:4318").otel_exporter_otlp_endpoint
    assert url == "http://collector:4318"

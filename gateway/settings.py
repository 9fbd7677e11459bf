"""The gateway's one settings class, read from `GATEWAY_*` environment variables and `.env`.

There is no module-level instance: `create_app(settings=None)` and the CLI build one, and tests pass
their own `Settings(...)`. Every field is listed with its default in `.env.example` and explained in
`docs/configuration.md`.

Over ~300 lines for one reason: one class of ~80 fields. pydantic-settings reads every `GATEWAY_*`
variable into one model, the cross-field checks (`_check_body_budget`, `_check_admin_jwks`, ...)
need the fields side by side, and `unknown_variables` reads their names from this one class; mixins
per group would scatter what a reader looks up together. The units of `upstream/`, `limits/` and
`batch/` do not take this class: they take the narrow frozen views in `gateway.policies`, each built
from it by `View.of(settings)`.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, HttpUrl, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.model_names import ModelAliases, model_aliases

Dialect = Literal["ollama", "openai"]

#: The routing policies (`GATEWAY_ROUTING`, `gateway.upstream.scheduling.scheduler`).
ROUTING_POLICIES = ("least_in_flight", "round_robin", "scored")

#: The scores of `GATEWAY_ROUTING=scored` (`gateway.upstream.scheduling.scores`).
ROUTING_SCORES = ("prefix", "load", "residency", "server")

#: A serialized origin as browsers send it (RFC 6454 section 6.2): `scheme://host[:port]`, lower
#: case, no path; the host a DNS name (IDNs in their `xn--` form) or a bracketed IPv6 address.
_ORIGIN = re.compile(
    r"[a-z][a-z0-9+.-]*://(?:[a-z0-9_-]+(?:\.[a-z0-9_-]+)*|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?"
)


class UpstreamSpec(BaseModel):
    """One model server in `GATEWAY_UPSTREAMS` (a JSON list of these objects).

    Attributes:
        url: Base URL of the model server.
        dialect: `ollama` or `openai` (see `GATEWAY_UPSTREAM_DIALECT`).
        weight: Share of the load relative to the others (least in-flight / weight wins).
        api_key: Credential the gateway sends to this upstream.
        host_header: `Host` header for this upstream.
        max_concurrent: Requests in flight to it at once; None: `GATEWAY_UPSTREAM_MAX_CONCURRENT`.
    """

    url: HttpUrl
    dialect: Dialect = "ollama"
    weight: float = Field(1.0, gt=0)
    api_key: SecretStr | None = None
    host_header: str | None = None
    max_concurrent: int | None = Field(None, ge=0)

    @property
    def name(self) -> str:
        """`host:port`, the `upstream` metrics label."""
        return f"{self.url.host}:{self.url.port}"

    @property
    def base(self) -> str:
        """The base URL without a trailing slash."""
        return str(self.url).rstrip("/")


def page_redirect_uri(uri: str) -> str | None:
    """`uri` as compared with `GATEWAY_ADMIN_OIDC_REDIRECT_URIS`, or None if it cannot be one.

    The admin page's URL: http(s), a host, a path ending in `/admin/`, no userinfo, query or
    fragment, printable ASCII. Scheme and host are compared in lower case and a default port
    (80, 443) is dropped, as a browser writes `location.href` (WHATWG URL); the path is exact.
    """
    if not uri.isascii() or not uri.isprintable() or len(uri) > 2048:
        return None
    parts = urlsplit(uri)
    try:
        port = parts.port
    except ValueError:
        return None
    if (
        parts.scheme.lower() not in {"http", "https"}
        or not parts.hostname
        or not re.fullmatch(r"[a-z0-9.-]+|[0-9a-f:.]+", parts.hostname)  # no `*` wildcards
        or parts.username is not None
        or parts.query
        or parts.fragment
        or "#" in uri
        or "?" in uri
        or not parts.path.endswith("/admin/")
    ):
        return None
    scheme = parts.scheme.lower()
    default = {"http": 80, "https": 443}[scheme]
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if port in (None, default) else f"{host}:{port}"
    return f"{scheme}://{netloc}{parts.path}"


class Settings(BaseSettings):
    """Gateway configuration. Times are in seconds, sizes in bytes.

    Raises:
        pydantic.ValidationError: on a malformed value, or a timeout that cannot work
            (for example an idle timeout longer than the first-byte timeout is allowed, but a
            non-positive one is not).
    """

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_file=".env",
        env_ignore_empty=True,
        extra="ignore",
        # A refused value is never echoed: it may be a secret (GATEWAY_ADMIN_JWT_SECRET, a
        # password in GATEWAY_DATABASE_URL); messages name the variable instead.
        hide_input_in_errors=True,
    )

    # --- serving -------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `gateway serve` binds to.")
    port: int = Field(8080, ge=1, le=65535, description="Port `gateway serve` listens on.")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    workers: int | Literal["auto"] = Field(
        1,
        description="Worker processes behind the one listening socket (`--workers` overrides); "
        "`auto`: one per CPU. More than 1 needs Redis limit storage (gateway.serve.workers).",
    )

    # --- client connections (gateway.serve.door)
    # -----------------------------------------------------
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a client has to send a request's head, from connecting (or from "
        "its first byte on a kept-alive connection); then 408, or a close if nothing came.",
    )
    body_timeout: float = Field(
        30.0, gt=0, description="Seconds allowed between two pieces of a request body; then 408."
    )
    body_min_bytes_per_second: int = Field(
        64 * 1024,
        ge=1,
        description="Slowest average pace of a buffered request body after a grace of "
        "`GATEWAY_BODY_TIMEOUT` seconds; slower: 408 (a trickled body held its share of "
        "`GATEWAY_MAX_BUFFERED_BODY_BYTES` without bound).",
    )
    keepalive_timeout: float = Field(
        5.0, gt=0, description="Seconds an idle kept-alive client connection stays open."
    )
    max_header_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest request head (target and header lines), in bytes; over it: 431.",
    )
    max_headers: int = Field(100, ge=8, description="Most header fields in a request; then 431.")
    max_client_connections: int = Field(
        1000,
        ge=0,
        description="Open client connections per process; one more gets 503 and is closed. "
        "0: as many as the open-files limit allows, which also lowers a larger value.",
    )
    max_client_connections_per_address: int | None = Field(
        None,
        ge=0,
        description="Open client connections per process from one client address (an IPv6 "
        "/64), GATEWAY_TRUSTED_PROXIES excepted; one more gets 503 and is closed. Unset: a "
        "quarter of the connection cap; 0: no share.",
    )

    # --- upstream ------------------------------------------------------------------------------
    upstream_url: HttpUrl = Field(
        HttpUrl("http://127.0.0.1:11434"),
        description="Base URL of the model server (Ollama's native API, or an "
        "OpenAI-compatible server).",
    )
    upstream_dialect: Dialect = Field(
        "ollama",
        description="`ollama`: relay to /api/generate and /api/chat; "
        "`openai`: translate to /v1/chat/completions and /v1/completions.",
    )
    upstream_api_key: SecretStr | None = Field(
        None,
        description="Credential the gateway itself sends upstream as `Authorization: Bearer` "
        "(vLLM --api-key, LM Studio). The client's credentials are never forwarded.",
    )
    upstreams: list[UpstreamSpec] | None = Field(
        None,
        description="Several model servers, as a JSON list of {url, dialect, weight, api_key, "
        "host_header, max_concurrent}; replaces GATEWAY_UPSTREAM_URL and its companions.",
    )
    circuit_failures: int = Field(
        3, ge=1, description="Consecutive failures that take an upstream out of rotation."
    )
    circuit_cooldown: float = Field(
        10.0, gt=0, description="Seconds out of rotation before one trial request is let through."
    )
    upstream_host_header: str | None = Field(
        None,
        description="`Host` header sent upstream. Default: the upstream URL's host:port, which "
        "passes Ollama's loopback Host gate (reference section 6.8).",
    )
    connect_timeout: float = Field(
        5.0, gt=0, description="Seconds to open a TCP connection upstream."
    )
    first_byte_timeout: float = Field(
        300.0,
        gt=0,
        description="Seconds from sending the request to the first streamed chunk. Long on "
        "purpose: Ollama sends nothing while it loads a model (reference section 1; "
        "OLLAMA_LOAD_TIMEOUT is 5m).",
    )
    idle_timeout: float = Field(
        60.0, gt=0, description="Seconds allowed between two chunks once the stream has started."
    )
    request_timeout: float = Field(
        600.0,
        ge=0,
        description="Seconds a whole request may take, first byte to last; 0: no limit. A "
        "stream that runs over ends with an error line.",
    )
    retry_attempts: int = Field(
        3,
        ge=1,
        description="Tries of an upstream request on the same upstream before its first byte "
        "(connection refused or reset, 502/503/504; a 500 at most twice, only when no other "
        "upstream is left); 1: no retries.",
    )
    retry_backoff: float = Field(
        0.1, ge=0, description="Seconds before the first retry; doubles each time (with jitter)."
    )
    upstream_poll_interval: float = Field(
        15.0,
        gt=0,
        description="Seconds between background probes of the upstream (health, model list, "
        "Ollama's loaded models, another server's own /metrics).",
    )
    routing: Literal["least_in_flight", "round_robin", "scored"] = Field(
        "scored",
        description="How a request's upstream is chosen among those that can take it: "
        "`scored` (model residency, prompt-prefix affinity and token load, docs/operations.md), "
        "`least_in_flight` (fewest requests in flight per weight), or `round_robin`.",
    )
    routing_scores: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=lambda: {"prefix": 1.0, "load": 1.0, "residency": 1.0, "server": 1.0},
        description="Weights of the `scored` policy's costs (in tokens), `name=weight` separated "
        "by commas (prefix, load, residency, server: the queue and KV usage a server reports on "
        "its own /metrics beyond this gateway's requests); 0 or leaving one out turns it off.",
    )
    routing_balance_abs_threshold: int = Field(
        4,
        ge=0,
        description="`scored`: the least loaded upstream is taken when the busiest has more than "
        "this many requests in flight beyond the idlest ...",
    )
    routing_balance_rel_threshold: float = Field(
        1.5,
        ge=1,
        description="... and more than this many times as many (SGLang's balance guard).",
    )
    routing_prefix_blocks: int = Field(
        32768,
        ge=1,
        description="`scored`: prompt blocks the prefix index remembers over all upstreams "
        "(least recently sent forgotten first).",
    )
    routing_prefix_block_chars: int = Field(
        1024,
        ge=16,
        le=65536,
        description="`scored`: least characters of whole messages per hashed block (a prompt "
        "string: exactly; about 256 tokens).",
    )
    max_connections: int = Field(
        256, ge=1, description="Upper bound on open connections to each upstream (the pool)."
    )
    upstream_http_client: Literal["aiohttp", "httptools", "httpx"] = Field(
        "httptools",
        description="What carries upstream requests under httpx's API: `aiohttp` (its C "
        "parser; half the CPU per relayed chunk of `httpx`), `httptools` (the gateway's own "
        "HTTP/1.1 client: asyncio Protocols and llhttp) or `httpx` (httpcore, pure Python).",
    )

    shutdown_drain: float = Field(
        5.0,
        ge=0,
        description="Seconds between SIGTERM and closing the listener: /readyz answers 503 and "
        "new requests are refused so load balancers move traffic away.",
    )
    shutdown_timeout: float = Field(
        30.0,
        ge=0,
        description="Seconds in-flight requests may still run after the drain; streams still "
        "running then end with an error line.",
    )

    # --- requests ------------------------------------------------------------------------------
    max_body_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest request body accepted, in bytes (base64 images make chat "
        "bodies large).",
    )
    max_buffered_body_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Most request-body bytes the process holds at once, over every request "
        "(a body is charged by its Content-Length, or chunk by chunk, until its request ends). "
        "Past it: 503 with Retry-After. Bounds what slow or held bodies can take from memory.",
    )
    max_buffered_body_bytes_per_key: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Most of GATEWAY_MAX_BUFFERED_BODY_BYTES one key may hold at once. Past "
        "it: 429 with Retry-After. At least GATEWAY_MAX_BODY_BYTES.",
    )
    max_json_depth: int = Field(64, ge=4, description="Deepest nesting accepted in a request body.")
    max_json_values: int = Field(
        100_000,
        ge=1000,
        description="Most JSON values (array elements, object members, containers) accepted in "
        "a request body, counted before it is parsed: bounds the parsing work a body within "
        "the size limit can cause. A long chat holds a few thousand; a `context` array one "
        "per token.",
    )

    # --- keys ----------------------------------------------------------------------------------
    database_url: str = Field(
        "sqlite+aiosqlite:///./gateway.db",
        description="SQLAlchemy async URL of the key store: SQLite (one machine) or "
        "`postgresql+asyncpg://user@host/db` (replicas share it).",
    )
    database_auto_upgrade: bool = Field(
        True,
        description="Upgrade the database schema (Alembic migrations) at start-up and in every "
        "command that opens it. Off: refuse a database that is behind until "
        "`gateway db upgrade` is run. A database newer than the code is always refused.",
    )
    last_used_interval: float = Field(
        60.0,
        ge=0,
        description="A key's `last_used_at` is written at most once per this many seconds.",
    )
    key_cache_seconds: float = Field(
        1.0,
        ge=0,
        le=300,
        description="Seconds a verified key is served from memory instead of the key store; "
        "revocation, rotation and limit changes reach every replica within this bound. "
        "0: read the store on every request.",
    )

    # --- usage accounting (gateway.metering.usage) ---------------------------------------------
    usage_enabled: bool = Field(
        True,
        description="Record each key's requests, errors, tokens and times per model and UTC day "
        "in the database (`gateway keys usage`).",
    )
    usage_flush_seconds: float = Field(
        2.0,
        gt=0,
        le=300,
        description="Seconds between writes of the usage sums: at most this much usage is lost "
        "if the process is killed (a graceful stop loses none).",
    )
    usage_max_pending_rows: int = Field(
        10_000,
        ge=1,
        description="Most (key, model, day) rows kept in memory waiting to be written; a write "
        "starts early at half; beyond it usage is dropped and counted "
        "(`gateway_usage_dropped_total`).",
    )

    # --- batch jobs (gateway.batch) -----------------------------------------------------------
    batch_worker: bool = Field(
        True,
        description="Run batch lines in this process; false serves the Batch API but leaves "
        "the lines to other replicas.",
    )
    batch_max_concurrent: int = Field(
        4, ge=1, le=256, description="Batch lines in flight at once in this process."
    )
    batch_reserved_slots: int = Field(
        1,
        ge=0,
        description="Upstream slots a gated upstream (`GATEWAY_UPSTREAM_MAX_CONCURRENT`) keeps "
        "free for interactive requests: a batch line starts only while more than this many are "
        "free, and an interactive request that finds none free preempts a batch line.",
    )
    batch_max_file_bytes: int = Field(
        100 * 1024 * 1024, ge=1024, description="Largest file `POST /v1/files` accepts, in bytes."
    )
    batch_upload_min_bytes_per_second: int = Field(
        64 * 1024,
        ge=1,
        description="Slowest average pace an upload may keep after a grace of "
        "`GATEWAY_BODY_TIMEOUT` seconds; slower: 408 (a trickled upload held its slot without "
        "bound).",
    )
    batch_max_lines: int = Field(50_000, ge=1, description="Most lines in one batch input file.")
    batch_max_queued_lines_per_key: int = Field(
        200_000,
        ge=1,
        description="Most lines one key may have waiting or running over all its batches; a "
        "batch that would pass it is refused with 429.",
    )
    batch_max_stored_bytes_per_key: int = Field(
        1024**3,
        ge=1024,
        description="Most bytes one key's files (inputs, outputs, error files) may hold; an "
        "upload that would pass it is refused with 400.",
    )
    batch_max_attempts: int = Field(
        5, ge=1, le=100, description="Attempts per line before it goes to the error file."
    )
    batch_retry_base_seconds: float = Field(
        1.0, gt=0, le=600, description="First retry's backoff; it doubles per attempt (jittered)."
    )
    batch_retry_max_seconds: float = Field(
        60.0, gt=0, le=3600, description="Longest backoff between two attempts of a line."
    )
    batch_lease_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="How long a claimed line is this process's; renewed while it runs. After a "
        "crash, its lines resume elsewhere (or after a restart) this long after.",
    )
    batch_poll_seconds: float = Field(
        1.0, gt=0, le=60, description="Seconds between looks for new batch work."
    )
    batch_idle_poll_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="Seconds between looks while no batch is open on any replica (at least "
        "GATEWAY_BATCH_POLL_SECONDS): a batch created in this process starts at once, one "
        "created through another replica within this long.",
    )
    batch_storage_dir: str = Field(
        "",
        description="Directory for file contents; empty keeps them in the database.",
    )

    # --- stored responses (gateway.api.responses.store; docs/api.md) ---------------------------
    responses_store: bool = Field(
        False,
        description="Keep Responses API answers and their input in the database for "
        "previous_response_id and GET/DELETE /v1/responses/{id}; off: nothing is stored.",
    )
    responses_retention_seconds: int = Field(
        2_592_000, ge=60, description="Seconds a stored response is kept (default 30 days)."
    )
    responses_max_bytes_per_key: int = Field(
        67_108_864,
        ge=1024,
        description="Bytes of stored responses one key may hold; its oldest go first.",
    )

    # --- limits --------------------------------------------------------------------------------
    default_rpm: int = Field(
        0, ge=0, description="Requests per minute for keys without their own limit; 0: none."
    )
    default_tpm: int = Field(
        0,
        ge=0,
        description="Tokens per minute (prompt + output) for keys without their own; 0: none.",
    )
    default_max_concurrent: int = Field(
        0, ge=0, description="Requests in flight per key for keys without their own; 0: none."
    )
    tpm_reserve_tokens: int = Field(
        256,
        ge=0,
        description="Output tokens a request reserves against its key's TPM while it runs "
        "before the key has a completed answer on the model (then the most of its last 20), at "
        "most the request's own bound; settled with the real count when it ends.",
    )
    model_aliases: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="JSON object of model names clients ask for -> the model that runs, e.g. "
        '`{"claude-*": "qwen3-coder:30b"}`; `*` matches any characters. An exact name wins, '
        "then the longest pattern, then the first listed. Applied before the allow-list on every "
        "generation route: the allow-list, limits, usage and metrics see the target.",
    )
    rate_limit_storage: str = Field(
        "memory://",
        description="`memory://` (this process) or `redis://host:6379/0` (shared by replicas).",
    )
    rate_limit_key_prefix: str = Field("gateway", description="Prefix of the limiter's Redis keys.")
    rate_limit_fail_open: bool = Field(
        True,
        description="When the limiter storage fails: true admits requests unlimited (logged), "
        "false refuses them with 503.",
    )
    rate_limit_timeout: float = Field(
        0.25, gt=0, description="Seconds a limiter storage call may take before the policy applies."
    )
    rate_limit_lease_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="With Redis: seconds a request in flight counts against its key's "
        "max_concurrent without its process renewing it (every third of this); the requests of a "
        "process that died stop counting this long after its last renewal.",
    )
    auth_failures_per_minute: int = Field(
        20,
        ge=0,
        description="Failed authentications (no key, a wrong one, a repeated credential header) "
        "one client address may make on the API in a moving minute; more get 429. Valid keys "
        "are never refused by it. 0: no limit.",
    )
    admin_auth_failures_per_minute: int = Field(
        5,
        ge=0,
        description="The same per-address budget for the admin API's tokens (`/admin/v1`), "
        "counted apart. 0: no limit.",
    )
    upstream_max_concurrent: int = Field(
        0, ge=0, description="Requests in flight to the upstream at once (per process); 0: no gate."
    )
    upstream_queue_size: int = Field(
        64, ge=0, description="Requests allowed to wait for an upstream slot; more get 503."
    )
    upstream_queue_timeout: float = Field(
        30.0, gt=0, description="Seconds a request may wait for an upstream slot before a 503."
    )

    # --- browser apps (CORS, gateway.api.middleware.cors)
    # -----------------------------------------------------
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins of the browser apps that may call the API from another site "
        "(`https://app.example.com`), comma-separated or a JSON list; `*`: any site. Empty: "
        "no CORS headers at all.",
    )

    # --- logging -------------------------------------------------------------------------------
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Networks (CIDR, JSON list) of reverse proxies whose X-Forwarded-For names "
        "the client in the access log; empty: the peer address is the client.",
    )

    # --- metrics -------------------------------------------------------------------------------
    metrics_per_key: bool = Field(
        True,
        description="Label token counters with the key's name. Turn off for fleets with many keys.",
    )

    # --- tracing (gateway.tracing; docs/tracing.md) --------------------------------------------
    otel_exporter_otlp_endpoint: str | None = Field(
        None,
        description="Base URL of an OTLP/HTTP collector (`http://collector:4318`): turns "
        "OpenTelemetry tracing on. Unset: on only if the standard OTEL_EXPORTER_OTLP_ENDPOINT is.",
    )
    otel_service_name: str | None = Field(
        None,
        description="The traces' `service.name`; unset: OTEL_SERVICE_NAME, else `llm-gateway`.",
    )
    otel_capture_content: bool = Field(
        False,
        description="Put the prompt (messages, system prompt) and the answer's text on the "
        "upstream spans. Off: no prompt or answer text in any span.",
    )

    # --- admin API authentication (gateway.auth.jwt; docs/admin.md) ----------------------------
    admin_jwt_secret: SecretStr | None = Field(
        None,
        description="Shared secret (32 bytes or more, random) that signs the HS256 admin tokens "
        "`gateway admin token` mints. Unset, and no JWKS: the admin API is off.",
    )
    admin_jwks_url: HttpUrl | None = Field(
        None,
        description="URL of the identity provider's JWKS (https; http only on loopback): "
        "RS/ES-signed admin tokens are verified against its keys.",
    )
    admin_jwks_file: Path | None = Field(
        None, description="A JWKS file instead of GATEWAY_ADMIN_JWKS_URL (re-read as it is cached)."
    )
    admin_jwks_cache_seconds: float = Field(
        300.0, ge=1, le=86400, description="Seconds the JWKS is used before it is fetched again."
    )
    admin_jwks_min_refresh_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="Fewest seconds between two JWKS loads, whatever asks for one (an unknown "
        "`kid`, the cache expiring, a failed load): bounds what made-up kids can make the "
        "gateway fetch.",
    )
    admin_jwt_algorithms: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["RS256", "ES256"],
        description="Algorithms accepted from the identity provider (comma-separated or JSON): "
        "RS256, RS384, RS512, ES256, ES384, ES512. HS256 is accepted only with the secret.",
    )
    admin_jwt_issuer: str | None = Field(
        None, description="The `iss` identity-provider tokens must carry (required with a JWKS)."
    )
    admin_jwt_audience: str | None = Field(
        None, description="The `aud` identity-provider tokens must carry (required with a JWKS)."
    )
    admin_jwt_scope_claim: str = Field(
        "scope",
        min_length=1,
        description="Claim (dotted path, e.g. `realm_access.roles`) whose values grant scopes: "
        "a string is split on spaces, a list used as is.",
    )
    admin_jwt_admin_values: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Values of the scope claim (groups, roles) that grant the `admin` scope.",
    )
    admin_jwt_read_values: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Values of the scope claim (groups, roles) that grant the `read` scope.",
    )
    admin_jwt_leeway_seconds: float = Field(
        30.0, ge=0, le=300, description="Clock skew allowed on a token's exp, nbf and iat."
    )
    # --- admin web page sign-in with the identity provider (gateway.auth.oidc; docs/admin.md) --
    admin_oidc_client_id: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="Client id registered at the identity provider for the admin web page: "
        "offers single sign-on there (authorization code flow with PKCE). Needs the JWKS "
        "settings and GATEWAY_ADMIN_JWT_ISSUER.",
    )
    admin_oidc_redirect_uris: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="The admin page's exact URL(s), comma-separated (e.g. "
        "`https://gw.example.com/admin/`): the only redirect URIs the gateway redeems codes "
        "for. Required with GATEWAY_ADMIN_OIDC_CLIENT_ID.",
    )
    admin_oidc_client_secret: SecretStr | None = Field(
        None,
        description="Client secret, for a confidential client (sent with client_secret_basic); "
        "unset for a public client.",
    )
    admin_oidc_scopes: str = Field(
        "openid profile email",
        description="Scopes the page asks the identity provider for (space-separated; must "
        "hold `openid`).",
    )
    admin_oidc_token: Literal["id_token", "access_token"] = Field(
        "id_token",
        description="Which token of the sign-in opens the admin API: `id_token` (its `aud` is "
        "the client id, which the verifier then also accepts) or `access_token` (a JWT for "
        "GATEWAY_ADMIN_JWT_AUDIENCE).",
    )

    @field_validator(
        "admin_jwt_algorithms",
        "admin_jwt_admin_values",
        "admin_jwt_read_values",
        "admin_oidc_redirect_uris",
        mode="before",
    )
    @classmethod
    def _parse_admin_lists(cls, value: object) -> object:
        """Read a JSON list or a comma-separated string."""
        if not isinstance(value, str):
            return value
        if value.strip().startswith("["):
            return json.loads(value)  # ValueError -> ValidationError
        return [entry.strip() for entry in value.split(",") if entry.strip()]

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _parse_model_aliases(cls, value: object) -> object:
        """Read a JSON object of names (a clear message naming the variable for anything else)."""
        if isinstance(value, str):
            if not value.strip():
                return {}
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(
                    f"GATEWAY_MODEL_ALIASES is not valid JSON ({exc}): write an object such as "
                    '{"claude-*": "qwen3-coder:30b"}'
                ) from None
        if not isinstance(value, dict) or not all(
            isinstance(name, str) and isinstance(target, str) for name, target in value.items()
        ):
            raise ValueError(
                "GATEWAY_MODEL_ALIASES must be a JSON object of model names to model names"
            )
        return value

    @field_validator("routing", mode="before")
    @classmethod
    def _check_routing(cls, value: object) -> object:
        """Name the variable and its choices when the policy is not one of them."""
        if value not in ROUTING_POLICIES:
            raise ValueError(
                f"GATEWAY_ROUTING must be one of {', '.join(ROUTING_POLICIES)}, not {value!r}"
            )
        return value

    @field_validator("routing_scores", mode="before")
    @classmethod
    def _parse_routing_scores(cls, value: object) -> object:
        """Read `prefix=1,load=1,residency=1,server=1` (a message naming the variable otherwise)."""
        if not isinstance(value, str):
            return value
        weights: dict[str, float] = {}
        for entry in value.split(","):
            if not entry.strip():
                continue
            name, _, weight = entry.partition("=")
            try:
                weights[name.strip()] = float(weight)
            except ValueError:
                raise ValueError(
                    f"GATEWAY_ROUTING_SCORES: {entry.strip()!r} is not name=weight, e.g. "
                    "prefix=1,load=1,residency=1,server=1"
                ) from None
        return weights

    @field_validator("routing_scores")
    @classmethod
    def _check_routing_scores(cls, value: dict[str, float]) -> dict[str, float]:
        """Only the known scores, each weight finite and >= 0."""
        for name, weight in value.items():
            if name not in ROUTING_SCORES:
                raise ValueError(
                    f"GATEWAY_ROUTING_SCORES: unknown score {name!r}; the scores are "
                    + ", ".join(ROUTING_SCORES)
                )
            if not 0 <= weight < float("inf"):
                raise ValueError(f"GATEWAY_ROUTING_SCORES: {name}'s weight must be >= 0")
        return value

    @field_validator("model_aliases")
    @classmethod
    def _check_model_aliases(cls, value: dict[str, str]) -> dict[str, str]:
        """Empty names and targets, patterns as targets and chains are refused at start."""
        model_aliases(value)  # ValueError -> ValidationError, naming the variable
        return value

    @field_validator("admin_jwt_secret")
    @classmethod
    def _check_admin_jwt_secret(cls, secret: SecretStr | None) -> SecretStr | None:
        """Refuse a secret an attacker could guess: short, placeholder or low-variety text.

        The message never repeats the value (it may be a real secret with a typo).
        """
        if secret is None:
            return None
        value = secret.get_secret_value()
        letters = re.sub(r"[^a-z0-9]", "", value.lower())
        # Six letters or more, so a random secret contains one by chance at most once in 10^7.
        placeholders = ("change", "secret", "example", "replace", "xxxxxx", "password")
        problem = None
        if len(value.encode()) < 32:
            problem = "it is shorter than 32 bytes"
        elif any(word in letters for word in placeholders):
            problem = "it looks like a placeholder"
        elif len(set(value)) < 12:
            problem = "it repeats too few distinct characters"
        if problem:
            raise ValueError(
                f"GATEWAY_ADMIN_JWT_SECRET is too weak ({problem}); generate one with: "
                'python -c "import secrets; print(secrets.token_urlsafe(48))"'
            )
        return secret

    @model_validator(mode="after")
    def _check_body_budget(self) -> Settings:
        """A largest body fits a key's share, and the share fits the process's budget."""
        if not (
            self.max_body_bytes
            <= self.max_buffered_body_bytes_per_key
            <= self.max_buffered_body_bytes
        ):
            raise ValueError(
                "need GATEWAY_MAX_BODY_BYTES <= GATEWAY_MAX_BUFFERED_BODY_BYTES_PER_KEY <= "
                "GATEWAY_MAX_BUFFERED_BODY_BYTES (else a largest body could never be accepted)"
            )
        return self

    @model_validator(mode="after")
    def _check_admin_jwks(self) -> Settings:
        """Known algorithms; a JWKS needs one source, an issuer, an audience and a scope map."""
        allowed = {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512"}
        if not self.admin_jwt_algorithms or not set(self.admin_jwt_algorithms) <= allowed:
            raise ValueError(f"GATEWAY_ADMIN_JWT_ALGORITHMS must be some of {sorted(allowed)}")
        if self.admin_jwks_url is None and self.admin_jwks_file is None:
            return self
        if self.admin_jwks_url is not None and self.admin_jwks_file is not None:
            raise ValueError("set GATEWAY_ADMIN_JWKS_URL or GATEWAY_ADMIN_JWKS_FILE, not both")
        url = self.admin_jwks_url
        loopback = url is not None and url.host in {"localhost", "127.0.0.1", "[::1]", "::1"}
        if url is not None and url.scheme != "https" and not (url.scheme == "http" and loopback):
            raise ValueError("GATEWAY_ADMIN_JWKS_URL must be https (http only on loopback)")
        if not self.admin_jwt_issuer or not self.admin_jwt_audience:
            raise ValueError(
                "a JWKS needs GATEWAY_ADMIN_JWT_ISSUER and GATEWAY_ADMIN_JWT_AUDIENCE: without "
                "them any token the identity provider signs, for any app, would be accepted"
            )
        if not (self.admin_jwt_admin_values or self.admin_jwt_read_values):
            raise ValueError(
                "a JWKS needs GATEWAY_ADMIN_JWT_ADMIN_VALUES or GATEWAY_ADMIN_JWT_READ_VALUES "
                "(the groups or roles that grant a scope)"
            )
        return self

    @model_validator(mode="after")
    def _check_admin_oidc(self) -> Settings:
        """Sign-in on the page needs the provider's keys and issuer, and asks for `openid`.

        The issuer is where the gateway fetches the provider's discovery document
        (`<issuer>/.well-known/openid-configuration`, OpenID Connect Discovery 1.0 section 4),
        so it must be a URL held to the JWKS URL's rule: https, http only on loopback.
        """
        client_id, secret = self.admin_oidc_client_id, self.admin_oidc_client_secret
        if client_id is None:
            if secret is not None:
                raise ValueError(
                    "GATEWAY_ADMIN_OIDC_CLIENT_SECRET is set without GATEWAY_ADMIN_OIDC_CLIENT_ID"
                )
            return self
        if not client_id.isprintable() or client_id != client_id.strip():
            raise ValueError(
                "GATEWAY_ADMIN_OIDC_CLIENT_ID holds surrounding spaces or control characters"
            )
        if self.admin_jwks_url is None and self.admin_jwks_file is None:
            raise ValueError(
                "GATEWAY_ADMIN_OIDC_CLIENT_ID needs GATEWAY_ADMIN_JWKS_URL (or _FILE) and "
                "GATEWAY_ADMIN_JWT_ISSUER: the gateway verifies the provider's tokens with them"
            )
        issuer = urlsplit(self.admin_jwt_issuer or "")
        loopback = issuer.hostname in {"localhost", "127.0.0.1", "::1"}
        if not issuer.hostname or not (
            issuer.scheme == "https" or (issuer.scheme == "http" and loopback)
        ):
            raise ValueError(
                "with GATEWAY_ADMIN_OIDC_CLIENT_ID, GATEWAY_ADMIN_JWT_ISSUER must be the "
                "provider's https URL (http only on loopback): its discovery document is "
                "fetched from <issuer>/.well-known/openid-configuration"
            )
        example = "e.g. GATEWAY_ADMIN_OIDC_REDIRECT_URIS=https://gateway.example.com/admin/"
        if not self.admin_oidc_redirect_uris:
            raise ValueError(
                "GATEWAY_ADMIN_OIDC_CLIENT_ID needs GATEWAY_ADMIN_OIDC_REDIRECT_URIS: the admin "
                "page's exact URL(s) as browsers open it, comma-separated, the ones registered "
                f"at the identity provider ({example})"
            )
        for uri in self.admin_oidc_redirect_uris:
            if page_redirect_uri(uri) is None:
                raise ValueError(
                    f"GATEWAY_ADMIN_OIDC_REDIRECT_URIS entry {uri!r} is not the admin page's "
                    "URL: write scheme://host[:port]/.../admin/ without query or fragment "
                    f"({example})"
                )
        scopes = self.admin_oidc_scopes.split()
        if "openid" not in scopes or not all(
            scope.isascii() and scope.isprintable() and '"' not in scope and "\\" not in scope
            for scope in scopes
        ):
            raise ValueError(
                "GATEWAY_ADMIN_OIDC_SCOPES must be space-separated scopes that include openid "
                "(OpenID Connect Core 1.0 section 3.1.2.1), e.g. 'openid profile email'"
            )
        return self

    @field_validator("workers", mode="before")
    @classmethod
    def _parse_workers(cls, value: object) -> object:
        """A whole number from 1, or `auto` in any case: one clear message for anything else."""
        if isinstance(value, str):
            text = value.strip().lower()
            if text == "auto":
                return "auto"
            if not (text.isascii() and text.isdigit()) or int(text) < 1:
                raise ValueError(f"invalid worker count {value!r}: use 1 or more, or auto")
            return int(text)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"invalid worker count {value!r}: use 1 or more, or auto")
        return value

    @field_validator("otel_exporter_otlp_endpoint")
    @classmethod
    def _check_otlp_endpoint(cls, value: str | None) -> str | None:
        """An http:// or https:// URL (unset or empty: tracing off, unless OTEL_* says on).

        Without a scheme the exporter takes the value at start and then fails every export
        (`No connection adapters were found`), losing each span with an error in the log.
        """
        if not value or not value.strip():
            return None
        if not value.strip().lower().startswith(("http://", "https://")):
            raise ValueError(
                f"{value!r} is not an http:// or https:// URL (e.g. http://collector:4318)"
            )
        return value.strip()

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _parse_cors_origins(cls, value: object) -> object:
        """Read a JSON list (`["https://a.example"]`) or a comma-separated string."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)  # ValueError -> ValidationError
        return [entry.strip() for entry in text.split(",") if entry.strip()]

    @field_validator("cors_origins")
    @classmethod
    def _check_cors_origins(cls, origins: list[str]) -> list[str]:
        """Each entry must be `*` or an origin exactly as a browser sends it in `Origin`.

        The match is exact (Fetch standard, "CORS check"), so a trailing slash, a path or an
        upper-case letter would never match and silently leave the app blocked: refused here.
        `null` is refused: sandboxed iframes and `file:` pages of any site send it (MDN,
        "Access-Control-Allow-Origin").
        """
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"GATEWAY_CORS_ORIGINS entry {origin!r} is not an origin: write "
                    "scheme://host[:port] in lower case, without a path or trailing slash, "
                    "or *"
                )
        return origins

    @model_validator(mode="after")
    def _check_rate_limit_storage(self) -> Settings:
        """A typo in the storage URL must not silently mean per-process limits."""
        if not self.rate_limit_storage.startswith(("memory://", "redis://", "rediss://")):
            raise ValueError("GATEWAY_RATE_LIMIT_STORAGE must be memory://, redis:// or rediss://")
        return self

    @model_validator(mode="after")
    def _reject_placeholder_secrets(self) -> Settings:
        """Refuse the placeholder values shipped in `.env.example`."""
        if self.upstream_api_key is not None and self.upstream_api_key.get_secret_value() in {
            "changeme",
            "change-me",
        }:
            raise ValueError("GATEWAY_UPSTREAM_API_KEY still holds the placeholder value")
        # The replicated Kubernetes overlay ships `change-me` passwords in its Secret.
        for name, url in (
            ("GATEWAY_DATABASE_URL", self.database_url),
            ("GATEWAY_RATE_LIMIT_STORAGE", self.rate_limit_storage),
        ):
            password = urlsplit(url).password if "://" in url else None
            if password is not None and password.lower() in {"changeme", "change-me"}:
                raise ValueError(f"{name} still holds the placeholder password: set a real one")
        return self

    @model_validator(mode="after")
    def _check_trusted_proxies(self) -> Settings:
        """Each entry must be an IP network, so a typo is an error at start-up, not ignored."""
        for entry in self.trusted_proxies:
            ipaddress.ip_network(entry, strict=False)  # ValueError -> ValidationError
        return self

    @field_validator("workers")
    @classmethod
    def _check_workers(cls, workers: int | str) -> int | str:
        """At least one worker (`auto` is resolved by `gateway serve`)."""
        if isinstance(workers, int) and workers < 1:
            raise ValueError("GATEWAY_WORKERS must be 1 or more, or auto")
        return workers

    @property
    def aliases(self) -> ModelAliases:
        """`GATEWAY_MODEL_ALIASES` as a resolver (built once per distinct value)."""
        return model_aliases(self.model_aliases)

    @property
    def trusted_proxy_networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """`trusted_proxies` parsed (`10.0.0.0/8`, `::1`: a bare address is a /32 or /128)."""
        return [ipaddress.ip_network(entry, strict=False) for entry in self.trusted_proxies]

    @property
    def upstream_specs(self) -> list[UpstreamSpec]:
        """The upstreams to serve from: `GATEWAY_UPSTREAMS`, or the one-upstream settings."""
        if self.upstreams:
            return self.upstreams
        one = UpstreamSpec(
            url=self.upstream_url,
            dialect=self.upstream_dialect,
            api_key=self.upstream_api_key,
            host_header=self.upstream_host_header,
        )
        return [one]


#: `GATEWAY_*` variables that are not settings: the scripts', the test suite's, `gateway
#: bench`'s (docs/benchmarking.md) and `gateway batch`'s own (docs/batch.md).
NOT_SETTINGS = frozenset(
    {
        "GATEWAY_WHEEL_CACHE",
        "GATEWAY_TEST_POSTGRES_URL",
        "GATEWAY_BENCH_API_KEY",
        "GATEWAY_BENCH_TARGET",
        "GATEWAY_API_KEY",  # `gateway batch` (docs/batch.md)
        "GATEWAY_URL",
    }
)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The `GATEWAY_*` names in `environ` that no setting reads, sorted.

    pydantic-settings ignores them silently, so a typo (`GATEWAY_PROT=9999`) would leave the
    port at 8080 with no word; `gateway serve` logs a warning for each.

    Args:
        environ: For example `os.environ`.
    """
    known = {f"GATEWAY_{name.upper()}" for name in Settings.model_fields} | NOT_SETTINGS
    return sorted(
        name
        for name in environ
        if name.upper().startswith("GATEWAY_") and name.upper() not in known
    )

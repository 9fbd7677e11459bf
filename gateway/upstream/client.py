"""The one shared httpx client per app, with explicit timeouts and pool limits (STYLE section 5)."""

from __future__ import annotations

from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

from gateway.metering.metrics import Metrics
from gateway.policies import PoolPolicy, UpstreamTimeouts
from gateway.settings import UpstreamSpec
from gateway.upstream.httptools_transport import HttptoolsTransport
from gateway.upstream.transport import AiohttpTransport


def upstream_timeout(timeouts: UpstreamTimeouts) -> httpx.Timeout:
    """Return httpx's per-socket-operation timeouts for upstream calls, in seconds.

    httpx's read timeout applies to every socket read, including the wait for the response
    headers, which Ollama sends only with the first token (reference section 1). It is set to
    the longer of the first-byte and idle timeouts. Generations (`GenerationClient`) drop it:
    the relay enforces each of the two precisely with its own deadline.
    """
    read = max(timeouts.first_byte, timeouts.idle)
    return httpx.Timeout(
        connect=timeouts.connect,
        read=read,
        write=timeouts.idle,
        pool=timeouts.connect,
    )


def upstream_default_headers(spec: UpstreamSpec) -> dict[str, str]:
    """Headers on every upstream call (generation, model list, readiness probe).

    `Host` defaults to the upstream URL's host:port (httpx derives it), which passes Ollama's
    loopback Host gate (reference section 6.8); the upstream's `host_header`
    (`GATEWAY_UPSTREAM_HOST_HEADER`) overrides it.
    `Authorization` carries the gateway's own upstream credential, if one is configured.
    `Accept-Encoding: identity` spares decompressing token streams.
    """
    headers = {"accept-encoding": "identity", "user-agent": "llm-gateway"}
    if spec.host_header:
        headers["host"] = spec.host_header
    if spec.api_key is not None:
        headers["authorization"] = f"Bearer {spec.api_key.get_secret_value()}"
    return headers


def build_upstream_client(
    spec: UpstreamSpec, timeouts: UpstreamTimeouts, transport: httpx.AsyncBaseTransport
) -> httpx.AsyncClient:
    """Build the upstream client: base URL, timeouts, default headers; never `timeout=None`.

    It serves the model lists and the readiness probes; generations go through
    `GenerationClient` over the same `transport`, which this client owns (closes).

    Args:
        spec: The upstream (URL, credential, Host override).
        timeouts: The upstream call timeouts (seconds).
        transport: From `build_upstream_transport`, or a test transport
            (for example `httpx.MockTransport`).

    Returns:
        An `httpx.AsyncClient` the app's lifespan closes.
    """
    return httpx.AsyncClient(
        base_url=spec.base,
        # Never keep upstream cookies: one client serves every tenant, and a cookie set by an
        # upstream or a proxy in front of it would be replayed on everyone's requests.
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        headers=upstream_default_headers(spec),
        timeout=upstream_timeout(timeouts),
        transport=transport,
        follow_redirects=False,
        trust_env=False,
    )


def build_upstream_transport(
    spec: UpstreamSpec, policy: PoolPolicy, metrics: Metrics | None = None
) -> httpx.AsyncBaseTransport:
    """Return the transport `GATEWAY_UPSTREAM_HTTP_CLIENT` names: aiohttp, httptools or httpcore.

    Each keeps at most `GATEWAY_MAX_CONNECTIONS` connections to the upstream, kept alive for
    30 s when idle. aiohttp costs half the CPU per relayed chunk of httpcore
    (`gateway.upstream.transport`); httptools, the gateway's own client, less than aiohttp
    (`gateway.upstream.httptools_transport`).

    Args:
        spec: The upstream (its name labels `gateway_upstream_connections_in_use`).
        policy: Its `http_client` and `max_connections`.
        metrics: Where the aiohttp and httptools transports keep
            `gateway_upstream_connections_in_use`.
    """
    limits = httpx.Limits(
        max_connections=policy.max_connections,
        max_keepalive_connections=policy.max_connections,
        keepalive_expiry=30.0,
    )
    in_use = metrics.upstream_connections_in_use.labels(spec.name) if metrics else None
    if policy.http_client == "aiohttp":
        return AiohttpTransport(limits, in_use)
    if policy.http_client == "httptools":
        return HttptoolsTransport(limits, in_use)
    return httpx.AsyncHTTPTransport(limits=limits)


class GenerationClient:
    """Sends generation requests to one upstream, straight to its transport.

    `httpx.AsyncClient.send` adds to every request what a generation never needs: cookie
    extraction and merging (`http.cookiejar`, with a `urllib.request.Request` built per call),
    the auth and redirect flows, event hooks. Together with `build_request` that is about 70 µs
    of CPU per request on a warm CPU, several times more right after the event loop was idle
    (docs/performance.md). This client keeps what `build_upstream_client` sets (base URL, default
    headers, timeouts) and calls the transport itself, through httpx's public transport API
    (`httpx.AsyncBaseTransport.handle_async_request`). Closing the response frees its
    connection; the transport belongs to the upstream's `httpx.AsyncClient`.

    Timeouts (seconds): connect, write and pool as for every upstream call, but no per-read
    timeout: the relay bounds every wait itself (the first-byte and idle deadlines of
    `gateway.relay.exchange`), and a per-read timer would be re-armed for every chunk.
    """

    def __init__(
        self, spec: UpstreamSpec, timeouts: UpstreamTimeouts, transport: httpx.AsyncBaseTransport
    ) -> None:
        self._base = spec.base
        self._headers = upstream_default_headers(spec)
        timeout = upstream_timeout(timeouts)
        self._timeout = {
            "connect": timeout.connect,
            "read": None,
            "write": timeout.write,
            "pool": timeout.pool,
        }
        self._transport = transport
        #: Per path: its URL and the `Host` field httpx would derive from it.
        self._urls: dict[str, tuple[httpx.URL, tuple[bytes, bytes]]] = {}

    def request(self, path: str, content: bytes, headers: dict[str, str]) -> httpx.Request:
        """Build a POST of `content` to `path` (absolute, e.g. `/api/chat`).

        `headers` (lower-case names, as `upstream_request_headers` and the dialects make them;
        no `Content-Length`) are added to the upstream's default headers and win over them;
        `Host` (unless the defaults override it) and `Content-Length` are added as httpx adds
        them, in the same order: the fields are the ones `httpx.Request(content=...)` makes.
        Built here from the cached URL and `stream=`, which skips httpx's derivation of them
        (two header normalisations and the body's encoding): about 6 µs against 19
        (docs/performance.md).

        Raises:
            UnicodeEncodeError: a header value is not ASCII (as httpx raises it).
        """
        target = self._urls.get(path)
        if target is None:
            url = httpx.URL(self._base + path)
            target = self._urls[path] = (url, (b"Host", url.netloc))
        url, host = target
        merged = {**self._headers, **headers}
        # ASCII, as httpx encodes `str` fields (and raises for anything else).
        fields = [(name.encode("ascii"), value.encode("ascii")) for name, value in merged.items()]
        if "host" not in merged:
            fields.insert(0, host)
        fields.append((b"Content-Length", b"%d" % len(content)))
        return httpx.Request(
            "POST",
            url,
            headers=fields,
            stream=httpx.ByteStream(content),
            extensions={"timeout": self._timeout},
        )

    async def send(self, request: httpx.Request) -> httpx.Response:
        """Send `request`; the body of the response is not read yet.

        Raises:
            httpx.TransportError: connecting, sending or reading the headers failed
                (`gateway.upstream.transport` lists which).
        """
        return await self._transport.handle_async_request(request)

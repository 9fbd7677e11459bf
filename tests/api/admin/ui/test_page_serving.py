"""How the admin page is served: only with the admin API on, only its own files, with its headers.

Over the app on a loopback uvicorn (no browser: tests/api/admin/ui/test_admin_page.py drives
one). Also what the files themselves promise: no inline script or style for the CSP to allow,
no markup built from strings, and every file shipped in the wheel.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import httpx
import pytest

from gateway.api.admin.page import ASSETS, CONTENT_SECURITY_POLICY
from tests.auth.test_admin_jwt import SECRET as ADMIN_SECRET
from tests.support.stack import Gateway

SECRET = ADMIN_SECRET
UI = resources.files("gateway.api.admin") / "ui"
PAGE_FILES = sorted([*ASSETS, "index.html"])


@pytest.fixture
def on(make_gateway: Callable[..., Gateway]) -> str:
    return make_gateway(admin_jwt_secret=SECRET).url


def test_every_admin_page_path_is_404_while_the_admin_api_is_off(gateway: Gateway) -> None:
    for path in ("/admin", "/admin/", "/admin/ui/app.js", "/admin/ui/app.css", "/admin/ui/x"):
        response = httpx.get(f"{gateway.url}{path}")
        assert response.status_code == 404, path
        assert "content-security-policy" not in response.headers


def test_admin_redirects_relatively_so_a_path_prefix_survives(on: str) -> None:
    response = httpx.get(f"{on}/admin")
    assert response.status_code == 308
    assert response.headers["location"] == "admin/"  # /llm/admin -> /llm/admin/ behind a proxy


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_the_page_and_each_asset_carry_the_policy_and_their_types(on: str) -> None:
    page = httpx.get(f"{on}/admin/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-store"
    assert page.text == (UI / "index.html").read_text(encoding="utf-8")
    for response in [page, *(httpx.get(f"{on}/admin/ui/{name}") for name in ASSETS)]:
        assert response.status_code == 200, response.url
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
    for name, media_type in ASSETS.items():
        response = httpx.get(f"{on}/admin/ui/{name}")
        assert response.headers["content-type"] == media_type
        assert response.headers["cache-control"] == "no-cache"
        assert response.content == (UI / name).read_bytes()
    assert CONTENT_SECURITY_POLICY == (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )


@pytest.mark.slow  # over 0.5 s on 2 cores (the fast tier's rule)
def test_head_answers_like_get_without_a_body(on: str) -> None:
    for path in ("/admin", "/admin/", *(f"/admin/ui/{name}" for name in ASSETS)):
        got, head = httpx.get(f"{on}{path}"), httpx.head(f"{on}{path}")
        assert head.status_code == got.status_code, path  # 405 before HEAD was routed
        assert head.content == b"", path
        for header in ("content-type", "content-length", "content-security-policy", "etag"):
            assert head.headers.get(header) == got.headers.get(header), (path, header)


def test_nothing_in_the_page_needs_data_urls() -> None:
    # The policy allows images from the gateway only; a data: URL in a file would break.
    for name in PAGE_FILES:
        assert "data:" not in (UI / name).read_text(encoding="utf-8"), name


def test_an_asset_is_revalidated_by_its_etag(on: str) -> None:
    first = httpx.get(f"{on}/admin/ui/app.js")
    again = httpx.get(f"{on}/admin/ui/app.js", headers={"If-None-Match": first.headers["etag"]})
    assert (again.status_code, again.content) == (304, b"")
    assert again.headers["etag"] == first.headers["etag"]
    other = httpx.get(f"{on}/admin/ui/app.js", headers={"If-None-Match": '"stale"'})
    assert other.status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/admin/ui/index.html",  # the page is /admin/, not an asset
        "/admin/ui/../routes.py",
        "/admin/ui/..%2Froutes.py",
        "/admin/ui/%2e%2e%2fpage.py",
        "/admin/ui/..%2f..%2fsettings.py",
        "/admin/ui/ui%2Fapp.js",
        "/admin/ui/APP.JS",
        "/admin/ui/app.js%00.css",
        "/admin/ui/",
        "/admin/ui/sub/app.js",
    ],
)
def test_only_the_listed_files_are_served(on: str, path: str) -> None:
    response = httpx.get(f"{on}{path}")
    assert response.status_code == 404, response.text
    assert b"import" not in response.content
    assert b"def " not in response.content


def test_the_allow_list_names_exactly_the_files_shipped() -> None:
    shipped = sorted(entry.name for entry in UI.iterdir() if entry.is_file())
    assert shipped == PAGE_FILES


class _Markup(HTMLParser):
    """Collects what the CSP would have to allow in the page: inline scripts, styles, handlers."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self.modules: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        for name, _ in attrs:
            if name == "style" or name.startswith("on"):
                self.problems.append(f"<{tag} {name}=...>")
        if tag == "style":
            self.problems.append("<style>")
        if tag == "script":
            if not names.get("src"):
                self.problems.append("inline <script>")
            else:
                self.modules.append(str(names["src"]))
        for name in ("src", "href"):
            value = names.get(name) or ""
            if value.startswith(("/", "http:", "https:", "//", "javascript:")):
                self.problems.append(f"non-relative {name}={value}")


def test_the_page_has_no_inline_script_style_or_handler_and_only_relative_urls() -> None:
    parser = _Markup()
    parser.feed((UI / "index.html").read_text(encoding="utf-8"))
    assert parser.problems == []
    assert parser.modules == ["ui/app.js"]


def test_the_scripts_build_no_markup_from_strings_and_call_only_relative_urls() -> None:
    forbidden = re.compile(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|"
        r"setAttribute\(['\"]style|localStorage\.|document\.cookie|fetch\(['\"`]/"
    )
    for name in ASSETS:
        if not name.endswith(".js"):
            continue
        text = (UI / name).read_text(encoding="utf-8")
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
        assert not forbidden.findall(code), name
        for target in re.findall(r"'((?:v1|oidc)/[^']*)'", code):
            assert not target.startswith("/"), target


def test_the_wheel_ships_every_file_of_the_page(tmp_path: Path) -> None:
    from hatchling.builders.wheel import WheelBuilder

    root = Path(__file__).resolve().parents[4]
    (wheel,) = WheelBuilder(str(root)).build(directory=str(tmp_path), versions=["standard"])
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in PAGE_FILES:
        assert f"gateway/api/admin/ui/{name}" in names, name
    assert "gateway/api/admin/page.py" in names

"""One `gateway serve` with an admin secret in front of the emulator, and one Chromium, per module.

Starting a browser and a gateway takes seconds; the tests of a module share them and start
from a clean tab each (`page`: session storage cleared, desktop width, light scheme). Each
test makes keys of its own names, so they do not depend on one another's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auth.jwt import mint_token
from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from gateway.testing.stack import gateway_process
from tests.auth.test_admin_jwt import SECRET
from tests.support.browser import WIDE, AdminPage, chrome, require_browser
from tests.support.stack import Emulator


@dataclass
class Stack:
    """The gateway under test: its URL, the emulator behind it, and its CLI environment."""

    url: str
    emulator: Emulator
    env: dict[str, str]
    workdir: Path

    def token(
        self, scope: str = "admin", *, subject: str = "alice@example.com", ttl: float = 3600
    ) -> str:
        """An admin token as `gateway admin token` mints it."""
        return mint_token(
            SECRET,
            subject=subject,
            scope=scope,
            ttl=timedelta(seconds=ttl),  # type: ignore[arg-type]
        )

    def api(self, method: str, path: str, *, token: str | None = None, **kwargs: Any) -> Any:
        """One admin API call with an admin token; its JSON (the call must succeed)."""
        headers = {"Authorization": f"Bearer {token or self.token()}"}
        response = httpx.request(
            method, f"{self.url}/admin/v1{path}", headers=headers, timeout=30, **kwargs
        )
        assert response.is_success, response.text
        return response.json()

    def has(self, path: str) -> bool:
        """Whether this gateway serves `/admin/v1{path}` (the live helper's endpoints)."""
        headers = {"Authorization": f"Bearer {self.token('read')}"}
        return (
            httpx.get(f"{self.url}/admin/v1{path}", headers=headers, timeout=30).status_code != 404
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_browser()
    workdir = tmp_path_factory.mktemp("admin-page")
    app = create_emulator_app(EmulatorConfig())
    env = {
        "GATEWAY_ADMIN_JWT_SECRET": SECRET,
        # The expired-token test waits for its token's exp, not for exp plus 30 s of skew.
        "GATEWAY_ADMIN_JWT_LEEWAY_SECONDS": "0",
        "GATEWAY_USAGE_FLUSH_SECONDS": "0.3",
        "GATEWAY_KEY_CACHE_SECONDS": "0.5",
        "GATEWAY_SHUTDOWN_DRAIN": "0.2",
    }
    with LoopbackServer(app) as emulator_server:
        env["GATEWAY_UPSTREAM_URL"] = emulator_server.url
        with gateway_process(workdir, env) as gateway:
            emulator = Emulator(emulator_server.url, app.state.emulator)
            yield Stack(gateway.url, emulator, gateway.extra_env, workdir)


@pytest.fixture(scope="module")
def driver(stack: Stack) -> Iterator[Any]:
    with chrome() as browser:
        yield browser


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Note whether a test's body failed, for `page` to leave what the browser showed."""
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


@pytest.fixture
def page(
    driver: Any, stack: Stack, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[AdminPage]:
    """The admin page, freshly loaded at desktop width in the light scheme, nobody signed in.

    When the test fails, the screen is saved in the test's temporary directory and the
    browser's console printed (pytest shows both with the failure).
    """
    admin_page = AdminPage(driver, stack.url)
    admin_page.viewport(*WIDE)
    admin_page.open()
    yield admin_page
    if request.node.stash.get(FAILED, False):
        shot = tmp_path / "failure.png"
        driver.save_screenshot(str(shot))
        print(f"the browser's screen: {shot}; its URL {driver.current_url}")  # noqa: T201
        for entry in admin_page.console():
            print("console:", entry.get("level"), entry.get("message"))  # noqa: T201

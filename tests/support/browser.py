"""A real browser for the admin page's tests: Debian's `chromium` driven by `chromium-driver`.

`chrome()` starts a headless Chromium through Selenium (a fresh profile in a temporary
directory, no background network, no sync); `require_browser()` skips a test with the reason
when Chromium, its driver or Selenium is missing, and fails it instead under `CI` (CI installs
them: .ci/run). `AdminPage` is what a test does on the page, in the page's own words (its
element ids are stable: the SSO tests reach the same controls).
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.servers import in_ci

CHROMIUM = os.environ.get("GATEWAY_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("GATEWAY_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
#: Generous: a loaded 2-core machine runs the browser, the gateway and the emulator at once.
WAIT = 30.0
#: docs/img/, where GATEWAY_SCREENSHOTS=1 saves each screen (docs/admin.md shows them).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"
#: The widths the page must read well at without scrolling sideways (a phone, a desktop).
NARROW, WIDE = (375, 812), (1440, 900)

T = TypeVar("T")


def require_browser() -> None:
    """Skip (fail under CI) when Chromium, chromium-driver or Selenium is missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (the dev extra)")
    if missing:
        message = (
            "the admin page's browser tests need Debian's chromium and chromium-driver "
            f"(apt-get install chromium chromium-driver); missing: {', '.join(missing)}"
        )
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)


@contextmanager
def chrome() -> Iterator[Any]:
    """A headless Chromium under Selenium, with its console log kept; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="gateway-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={WIDE[0]},{WIDE[1]}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


class AdminPage:
    """The admin page at `url` (the gateway's base URL) in `driver`."""

    def __init__(self, driver: Any, url: str) -> None:
        self.driver = driver
        self.url = url
        self.logs: list[dict[str, Any]] = []

    # --- waiting and finding -----------------------------------------------------------------

    def wait(self, condition: Callable[[], T], what: str, timeout: float = WAIT) -> T:
        """Poll `condition` until it returns something truthy; return that, or fail."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        def attempt(_: Any) -> T | bool:
            try:
                return condition() or False
            except (WebDriverException, AssertionError, LookupError):
                return False

        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(attempt)  # type: ignore[no-any-return]
        except Exception as exc:  # TimeoutException, with what it was waiting for
            raise AssertionError(f"{what}: not within {timeout} s") from exc

    def el(self, element_id: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def css(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.driver.find_elements(By.CSS_SELECTOR, selector))

    def shown(self, element_id: str) -> bool:
        return bool(self.el(element_id).is_displayed())

    def text(self, element_id: str) -> str:
        return str(self.el(element_id).text)

    def run(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def type(self, element_id: str, value: str) -> None:
        field = self.el(element_id)
        field.clear()
        field.send_keys(value)

    def click(self, element_id: str) -> None:
        self.wait(lambda: self.el(element_id).is_enabled() and self.shown(element_id), element_id)
        self.el(element_id).click()

    # --- the page ------------------------------------------------------------------------------

    def open(self) -> None:
        """Load /admin (which redirects to /admin/) in a clean tab state."""
        self.driver.get(f"{self.url}/admin")
        self.run("sessionStorage.clear()")
        self.driver.get(f"{self.url}/admin/")
        self.wait(lambda: self.shown("signin") or self.shown("tabs"), "the page started")

    def sign_in(self, token: str) -> None:
        self.wait(lambda: self.shown("token-input"), "the sign-in form")
        self.type("token-input", token)
        self.click("token-sign-in")
        self.wait(lambda: self.shown("tabs"), "signed in")

    def tab(self, name: str) -> None:
        self.click(f"tab-{name}")
        self.wait(lambda: self.shown(f"panel-{name}"), f"the {name} section")

    def key_row(self, key_id: str) -> Any:
        rows = self.css(f'#keys-table tbody tr[data-key-id="{key_id}"]')
        assert rows, f"no row for key {key_id}"
        return rows[0]

    def key_action(self, key_id: str, action: str) -> None:
        """Press a key's row button (edit, rotate, revoke), the row as it is once loaded."""

        def press() -> bool:
            self.key_row(key_id).find_element(
                "css selector", f"button[data-action={action}]"
            ).click()
            return True

        self.wait(press, f"the {action} button of key {key_id}")

    def secret_from_dialog(self) -> str:
        """Wait for the secret dialog and return the secret it shows."""
        self.wait(lambda: self.shown("secret-dialog"), "the secret dialog")
        secret = self.wait(lambda: self.el("secret-value").get_attribute("value"), "the secret")
        return str(secret)

    def close_secret(self) -> None:
        self.click("secret-close")
        self.wait(lambda: not self.shown("secret-dialog"), "the secret dialog closed")

    def no_horizontal_scroll(self) -> bool:
        return bool(self.run("return document.documentElement.scrollWidth <= window.innerWidth"))

    # --- the browser ---------------------------------------------------------------------------

    def viewport(self, width: int, height: int, *, dark: bool = False) -> None:
        """Emulate a screen of this CSS size (and the dark scheme), as a phone or a desktop."""
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600},
        )
        scheme = "dark" if dark else "light"
        self.driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
        )

    def console(self) -> list[dict[str, Any]]:
        """The console messages so far (all of them, kept across calls)."""
        self.logs.extend(self.driver.get_log("browser"))
        return self.logs

    def csp_violations(self) -> list[str]:
        return [
            str(entry["message"])
            for entry in self.console()
            if "Content Security Policy" in str(entry["message"])
        ]

    def screenshot(self, name: str) -> None:
        """Save this screen as docs/img/admin-NAME.png, only with GATEWAY_SCREENSHOTS=1."""
        if os.environ.get("GATEWAY_SCREENSHOTS") != "1":
            return
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.run("window.scrollTo(0, 0)")  # each screen from its top (a dialog stays centred)
        shot = self.driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
        (SCREENSHOTS / f"admin-{name}.png").write_bytes(base64.b64decode(shot["data"]))

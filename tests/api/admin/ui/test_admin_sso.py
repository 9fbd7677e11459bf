"""Single sign-on on the admin page, in a real browser, against the test OpenID provider.

Issue 32's "done when": Chromium (under Selenium) opens the page of a real `gateway serve`
whose admin API trusts oidc-provider-mock (`tests.support.oidc`), presses *Sign in with single
sign-on*, and on the provider's own form presses *Authorize as <user>*:

- alice-admin (in the admin group) is back on `/admin/` with nothing of the sign-in left in the
  address bar or the history, her token in the tab's session storage only (no cookie, nothing in
  localStorage), and creates a key;
- bob-reader (in the read group) reads the keys and sees no write control;
- carol-nobody (in neither) is refused with the gateway's own explanation and keeps no token;
- an answer whose `state` is not the tab's (login CSRF, OAuth 2.0 Security BCP section 4.7) is
  refused by the page before the gateway is asked to exchange its code (the code still works
  afterwards, so it was not spent);
- a sign-in that expires with the new-key form half filled: signing in again through the
  provider brings the page back with the form filled in (docs/admin.md: across an SSO round trip
  the new-key form is kept), and the key is made with what was typed.

With GATEWAY_SCREENSHOTS=1 the first test saves the sign-in screen (with its SSO button) as
docs/img/admin-sign-in.png, and the sign-out test the header of an SSO session as
docs/img/admin-sso-signed-in.png.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gateway.testing.emulator.app import EmulatorConfig, create_emulator_app
from gateway.testing.server import LoopbackServer
from gateway.testing.stack import free_port, gateway_process
from tests.api.admin.ui.conftest import FAILED
from tests.support.browser import WIDE, AdminPage, chrome, require_browser
from tests.support.oidc import (
    ADMIN_SUB,
    NOBODY_SUB,
    READER_SUB,
    OidcProvider,
    start_oidc_provider,
)

pytestmark = [pytest.mark.browser, pytest.mark.processes]

#: The page's session storage keys: the contract's names, each with the page's path after a
#: colon (two gateways behind path prefixes on one origin keep their own sign-in).
TOKEN_KEY = "gateway.admin.token:/admin/"
PENDING_KEY = "gateway.admin.oidc:/admin/"  # state, nonce and verifier while at the provider
DRAFTS_KEY = "gateway.admin.drafts:/admin/"
#: The ID tokens of the expiry test's own provider last this long: long enough to sign in and
#: open a form on a loaded machine, short enough to wait for.
SHORT_TOKEN_SECONDS = 30


@dataclass
class SsoStack:
    """A gateway whose admin API trusts `provider`, and a token of alice-admin's for its API."""

    url: str
    provider: OidcProvider

    @property
    def page_url(self) -> str:
        """The page's URL, which is also the redirect URI it registers with the provider."""
        return f"{self.url}/admin/"

    def exchange(self, sub: str) -> httpx.Response:
        """Sign `sub` in as a browser would (over HTTP) and post the code to `oidc/token`."""
        signed_in = self.provider.sign_in(sub, self.page_url)
        return httpx.post(f"{self.url}/admin/oidc/token", json=signed_in.body(), timeout=30)

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One admin API call with alice-admin's SSO token; its JSON (it must succeed)."""
        answer = self.exchange(ADMIN_SUB)
        assert answer.status_code == 200, answer.text
        headers = {"Authorization": f"Bearer {answer.json()['token']}"}
        response = httpx.request(
            method, f"{self.url}/admin/v1{path}", headers=headers, timeout=30, **kwargs
        )
        assert response.is_success, response.text
        return response.json()


@contextmanager
def sso_gateway(workdir: Path, provider: OidcProvider) -> Iterator[SsoStack]:
    """`gateway serve` in front of the emulator, its admin API signed into through `provider`."""
    port = free_port()  # the page's URL is a setting: known before the gateway starts
    env = provider.gateway_env(f"http://127.0.0.1:{port}/admin/") | {
        # The expiry test waits for its token's exp, not for exp plus 30 s of skew.
        "GATEWAY_ADMIN_JWT_LEEWAY_SECONDS": "0",
        "GATEWAY_SHUTDOWN_DRAIN": "0.2",
    }
    with LoopbackServer(create_emulator_app(EmulatorConfig())) as emulator:
        env["GATEWAY_UPSTREAM_URL"] = emulator.url
        with gateway_process(workdir, env, port=port) as gateway:
            yield SsoStack(gateway.url, provider)


@pytest.fixture(scope="module")
def sso_stack(
    oidc_provider: OidcProvider, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SsoStack]:
    require_browser()
    with sso_gateway(tmp_path_factory.mktemp("admin-sso"), oidc_provider) as stack:
        yield stack


@pytest.fixture(scope="module")
def driver(sso_stack: SsoStack) -> Iterator[Any]:
    with chrome() as browser:
        yield browser


@pytest.fixture
def page(
    driver: Any, sso_stack: SsoStack, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[AdminPage]:
    """The SSO gateway's admin page, freshly loaded at desktop width, nobody signed in.

    On failure the screen is saved in the test's temporary directory and the console printed.
    """
    admin_page = AdminPage(driver, sso_stack.url)
    admin_page.viewport(*WIDE)
    admin_page.open()
    admin_page.wait(lambda: admin_page.shown("sso-sign-in"), "the single sign-on button")
    yield admin_page
    if request.node.stash.get(FAILED, False):
        shot = tmp_path / "failure.png"
        driver.save_screenshot(str(shot))
        print(f"the browser's screen: {shot}; its URL {driver.current_url}")  # noqa: T201
        for entry in admin_page.console():
            print("console:", entry.get("level"), entry.get("message"))  # noqa: T201


# --- what the browser does and holds ------------------------------------------------------------


def _to_provider(page: AdminPage, button: str, sub: str) -> None:
    """Press `button` (an SSO button of the page) and wait for the provider's form for `sub`."""
    page.click(button)
    page.wait(lambda: page.css(f'[aria-label="Authorize as {sub}"]'), "the provider's form")


def _authorize(page: AdminPage, sub: str) -> None:
    """On the provider's form, sign in as `sub`; wait until the page has finished the return."""
    page.css(f'[aria-label="Authorize as {sub}"]')[0].click()
    page.wait(
        lambda: page.driver.current_url.startswith(f"{page.url}/admin/") and not _pending(page),
        "back on the page, the sign-in finished",
    )
    page.wait(lambda: page.shown("tabs") or page.text("sso-error"), "signed in or refused")


def _sso(page: AdminPage, sub: str) -> None:
    _to_provider(page, "sso-sign-in", sub)
    _authorize(page, sub)


def _pending(page: AdminPage) -> bool:
    """Whether the page still holds a sign-in in progress, or has not read the answer yet."""
    return bool(
        page.run(f"return sessionStorage.getItem('{PENDING_KEY}')")
        or "code=" in page.driver.current_url
        or page.run("return document.readyState") != "complete"
    )


def _stored(page: AdminPage) -> dict[str, Any] | None:
    text = page.run(f"return sessionStorage.getItem('{TOKEN_KEY}')")
    return None if text is None else dict(json.loads(text))


def _focused(page: AdminPage) -> str:
    return str(page.run("return document.activeElement && document.activeElement.id"))


def _fetched(page: AdminPage, path: str) -> list[str]:
    """The URLs this document fetched that end with `path` (Resource Timing, W3C)."""
    names = page.run(
        "return performance.getEntriesByType('resource')"
        ".filter((e) => e.initiatorType === 'fetch').map((e) => e.name)"
    )
    return [name for name in names if urlsplit(name).path.endswith(path)]


def _loaded_from(page: AdminPage) -> str:
    """The URL this document was loaded from (before the page rewrote its address)."""
    return str(page.run("return performance.getEntriesByType('navigation')[0].name"))


def _create(page: AdminPage, name: str) -> str:
    page.click("key-new")
    page.wait(lambda: page.shown("create-name"), "the new-key form")
    page.type("create-name", name)
    page.click("key-create-submit")
    return page.secret_from_dialog()


def _key_id(secret: str) -> str:
    return secret.split("_")[1]  # gw_<id>_<secret>


# --- the tests ----------------------------------------------------------------------------------


def test_an_admin_signs_in_with_sso_and_creates_a_key(page: AdminPage, sso_stack: SsoStack) -> None:
    assert page.shown("token-input")  # a pasted token remains possible beside SSO
    page.screenshot("sign-in")
    entries = page.run("return history.length")
    _sso(page, ADMIN_SUB)
    page.wait(lambda: page.shown("tabs"), "signed in")

    # The provider sent the browser back with a code and a state; the page exchanged the code
    # through the gateway and dropped both from the address bar and from the history entry.
    returned = parse_qs(urlsplit(_loaded_from(page)).query)
    code, state = returned["code"][0], returned["state"][0]
    assert _fetched(page, "/admin/oidc/token")
    assert page.driver.current_url == sso_stack.page_url
    assert page.run("return location.search + location.hash") == ""
    # Two entries more (the provider's form, the page back), the last replaced, none pushed.
    assert page.run("return history.length") == entries + 2
    storage = page.run("return JSON.stringify(sessionStorage)")
    assert code not in storage
    assert state not in storage

    assert page.text("who-text").startswith(f"Signed in as {ADMIN_SUB} (admin)")
    stored = _stored(page)
    assert stored is not None
    assert (stored["subject"], stored["sso"]) == (ADMIN_SUB, True)
    assert set(stored["scopes"]) == {"admin", "read"}
    assert stored["expires_at"] > time.time()
    assert page.run(f"return sessionStorage.getItem('{PENDING_KEY}')") is None
    assert page.run("return document.cookie") == ""
    assert page.run("return localStorage.length") == 0
    # The stored token is the one the admin API takes for her.
    whoami = httpx.get(
        f"{sso_stack.url}/admin/v1/whoami",
        headers={"Authorization": f"Bearer {stored['token']}"},
        timeout=30,
    )
    assert whoami.status_code == 200, whoami.text
    assert whoami.json()["subject"] == ADMIN_SUB

    assert page.shown("key-new")
    secret = _create(page, "made-by-alice")
    key_id = _key_id(secret)
    page.close_secret()
    assert sso_stack.api("GET", f"/keys/{key_id}")["name"] == "made-by-alice"
    created = sso_stack.api("GET", "/audit", params={"key_id": key_id, "action": "create"})
    assert [entry["actor"] for entry in created["data"]] == [ADMIN_SUB]
    page.wait(lambda: page.key_row(key_id), "the new key in the list")
    assert page.csp_violations() == []


def test_a_reader_signs_in_with_sso_and_sees_no_write_controls(
    page: AdminPage, sso_stack: SsoStack
) -> None:
    key_id = sso_stack.api("POST", "/keys", json={"name": "seen-by-bob"})["key"]["id"]
    _sso(page, READER_SUB)
    page.wait(lambda: page.shown("tabs"), "signed in")
    assert page.text("who-text").startswith(f"Signed in as {READER_SUB} (read only)")
    assert page.driver.current_url == sso_stack.page_url
    stored = _stored(page)
    assert stored is not None
    assert stored["scopes"] == ["read"]

    page.type("keys-name", "seen-by-bob")
    row = page.wait(lambda: page.key_row(key_id), "the key listed (a read works)")
    assert "seen-by-bob" in row.text
    assert row.find_elements("css selector", "button") == []  # no Edit, Rotate, Revoke
    assert not page.shown("key-new")
    assert not page.shown("key-create")
    visible = {button.text for button in page.css("button") if button.is_displayed()}
    assert visible <= {"Sign out", "Sign out of single sign-on too", "Keys", "Usage"} | {
        "Live",
        "Audit",
        "Search",
        "Previous page",
        "Next page",
    }


def test_a_user_in_neither_group_is_refused_with_the_gateway_s_reason(
    page: AdminPage, sso_stack: SsoStack
) -> None:
    _sso(page, NOBODY_SUB)
    page.wait(lambda: page.shown("sso-error"), "the refusal, beside the SSO button")
    # Focus on the refusal (a screen reader reads it), not on the token field.
    page.wait(lambda: _focused(page) == "sso-error", "the focus on the refusal")
    assert not page.shown("signin-error")
    message = page.text("sso-error")
    assert "token grants no admin scope" in message
    assert "none of the groups" in message  # the gateway's explanation, not a bare status
    assert _fetched(page, "/admin/oidc/token")  # asked, and refused
    assert not page.shown("tabs")
    assert page.shown("sso-sign-in")  # she may try another account
    assert _stored(page) is None
    assert page.run("return document.cookie") == ""
    assert page.run("return localStorage.length") == 0
    assert page.driver.current_url == sso_stack.page_url


def test_an_answer_with_another_state_is_refused_before_the_exchange(
    page: AdminPage, sso_stack: SsoStack
) -> None:
    refusal = "does not belong to this tab (state mismatch)"
    # No sign-in in progress in this tab: an answer out of nowhere.
    page.driver.get(f"{sso_stack.page_url}?code=x&state=wrong")
    page.wait(lambda: refusal in page.text("sso-error"), "the refusal")
    assert page.driver.current_url == sso_stack.page_url
    assert _fetched(page, "/admin/oidc/token") == []

    # A sign-in in progress, and a real code of alice's from another browser with its own
    # state (what an attacker would plant): refused, and the code is not spent.
    _to_provider(page, "sso-sign-in", ADMIN_SUB)
    planted = sso_stack.provider.sign_in(ADMIN_SUB, sso_stack.page_url)
    page.driver.get(f"{sso_stack.page_url}?code={planted.code}&state=wrong")
    page.wait(lambda: refusal in page.text("sso-error"), "the refusal")
    assert _fetched(page, "/admin/oidc/token") == []
    assert page.driver.current_url == sso_stack.page_url
    assert not page.shown("tabs")
    assert _stored(page) is None
    assert page.run(f"return sessionStorage.getItem('{PENDING_KEY}')") is None  # used up
    exchanged = httpx.post(
        f"{sso_stack.url}/admin/oidc/token", json=planted.body(), timeout=30
    )  # a code is exchanged once: this would be refused had the page sent it
    assert exchanged.status_code == 200, exchanged.text


def test_signing_out_of_sso_too_ends_the_provider_s_session_and_comes_back_signed_out(
    page: AdminPage, sso_stack: SsoStack
) -> None:
    _sso(page, ADMIN_SUB)
    page.wait(lambda: page.shown("tabs"), "signed in")
    stored = _stored(page)
    assert stored is not None
    button = page.el("sso-end-session")
    assert button.tag_name == "button"  # an action, styled as the other buttons
    page.screenshot("sso-signed-in")
    page.click("sso-end-session")

    # At the provider's end_session_endpoint, with what OpenID Connect RP-Initiated Logout 1.0
    # section 2 asks of the page: who it is, where to send the user back, and whose session.
    page.wait(lambda: "/oauth2/end_session" in page.driver.current_url, "the provider's logout")
    sent = parse_qs(urlsplit(page.driver.current_url).query)
    assert sent["client_id"] == ["llm-gateway-admin-page"]
    assert sent["post_logout_redirect_uri"] == [sso_stack.page_url]
    assert sent["id_token_hint"] == [stored["token"]]  # the page's token is the ID token
    end = [b for b in page.css("button") if b.text == "End session"]
    assert end, "the provider's confirmation form"
    end[0].click()

    page.wait(lambda: page.driver.current_url == sso_stack.page_url, "back on the page")
    page.wait(lambda: page.shown("signin"), "the sign-in screen")
    assert not page.shown("tabs")
    assert _stored(page) is None  # the page forgot its token before leaving
    assert page.shown("sso-sign-in")


def test_a_provider_error_is_shown_only_for_the_tab_s_own_sign_in(
    page: AdminPage, sso_stack: SsoStack
) -> None:
    # An error link made by anyone (no sign-in in progress): its text is not shown.
    planted = "Your account is locked: call +1 555 0100"
    page.driver.get(
        f"{sso_stack.page_url}?error=access_denied&error_description={planted}&state=made-up"
    )
    page.wait(lambda: page.shown("sso-error"), "the generic message")
    assert page.text("sso-error") == "The single sign-on was not completed: sign in again."
    assert "555" not in page.driver.page_source
    assert page.driver.current_url == sso_stack.page_url

    # The tab's own sign-in, refused at the provider: its reason is shown, the URL cleared.
    _to_provider(page, "sso-sign-in", ADMIN_SUB)
    state = parse_qs(urlsplit(page.driver.current_url).query)["state"][0]
    page.driver.get(
        f"{sso_stack.page_url}?error=access_denied&error_description=The+user+said+no&state={state}"
    )
    page.wait(
        lambda: (
            page.text("sso-error") == "The identity provider refused the sign-in: The user said no"
        ),
        "the provider's reason",
    )
    assert page.driver.current_url == sso_stack.page_url
    assert _focused(page) == "sso-error"
    assert page.run(f"return sessionStorage.getItem('{PENDING_KEY}')") is None
    assert _fetched(page, "/admin/oidc/token") == []
    assert not page.shown("tabs")


def test_an_expired_sso_sign_in_keeps_the_new_key_form_across_the_round_trip(
    driver: Any, tmp_path: Path
) -> None:
    # A provider and a gateway of this test's own: their ID tokens last seconds, not an hour.
    with (
        start_oidc_provider(tmp_path / "provider.log", token_max_age=SHORT_TOKEN_SECONDS) as idp,
        sso_gateway(tmp_path, idp) as stack,
    ):
        page = AdminPage(driver, stack.url)
        page.viewport(*WIDE)
        page.open()
        try:
            _sso(page, ADMIN_SUB)
            page.wait(lambda: page.shown("tabs"), "signed in")
            stored = _stored(page)
            assert stored is not None
            page.click("key-new")
            page.wait(lambda: page.shown("create-name"), "the new-key form")
            page.type("create-name", "made-after-sso-again")
            page.type("create-rpm", "42")
            page.type("create-tpm", "777")
            page.wait(
                lambda: time.time() > stored["expires_at"] + 1,
                "the sign-in expired",
                SHORT_TOKEN_SECONDS + 30,
            )
            page.click("key-create-submit")
            page.wait(lambda: page.shown("reauth-dialog"), "the sign-in dialog")
            assert page.text("reauth-reason") == "token expired"
            _to_provider(page, "reauth-sso", ADMIN_SUB)
            _authorize(page, ADMIN_SUB)
            page.wait(lambda: page.shown("tabs"), "signed in again")
            assert page.driver.current_url == stack.page_url
            again = _stored(page)
            assert again is not None
            assert again["expires_at"] > stored["expires_at"]  # a new sign-in, not the old one
            # The page was loaded afresh, with the form as it was left.
            page.wait(lambda: page.shown("create-name"), "the new-key form, open again")
            assert page.el("create-name").get_attribute("value") == "made-after-sso-again"
            assert page.el("create-rpm").get_attribute("value") == "42"
            assert page.el("create-tpm").get_attribute("value") == "777"
            assert page.run(f"return sessionStorage.getItem('{DRAFTS_KEY}')") is None
            page.click("key-create-submit")  # sent by the user (docs/admin.md)
            key_id = _key_id(page.secret_from_dialog())
            page.close_secret()
            key = stack.api("GET", f"/keys/{key_id}")
            assert (key["name"], key["rpm"], key["tpm"]) == ("made-after-sso-again", 42, 777)
        except BaseException:
            shot = tmp_path / "failure.png"
            driver.save_screenshot(str(shot))
            print(f"the browser's screen: {shot}; its URL {driver.current_url}")  # noqa: T201
            for entry in page.console():
                print("console:", entry.get("level"), entry.get("message"))  # noqa: T201
            raise

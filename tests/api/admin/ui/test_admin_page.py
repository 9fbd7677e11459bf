"""The admin page in a real browser (Chromium under Selenium) over a real `gateway serve`.

- The walk a new admin takes (issue 32's "done when"): sign in with a minted token, create a key
  limited to one model with RPM 5, copy its secret, use it with the `ollama` client, see it in
  the live view (or the page saying this gateway has none) and in usage, rotate it with a grace
  period (old and new secret both work, then only the new), revoke it (the next request is
  refused), and find each change in the audit trail.
- A `read` token sees no write control; a key named with markup shows as those characters; the
  CSP holds (no violation in the console, framing refused); 375 px and 1440 px wide with no
  sideways scroll; an expired token mid-form keeps the form and finishes the action after
  signing in again; every control has an accessible name; sign-out forgets the token and the
  search fields; a created key is marked without touching the filters; the CSV's every field
  quoted and formulas defused (usage.js's csvField, imported in the page); the sign-in is kept
  per page path (two gateways behind prefixes on one origin).

With GATEWAY_SCREENSHOTS=1 the tests save each screen to docs/img/admin-*.png (the sign-in
screen: test_admin_sso.py, which has the SSO button).
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from gateway.api.admin.page import CONTENT_SECURITY_POLICY
from gateway.testing.server import LoopbackServer
from tests.api.admin.ui.conftest import Stack
from tests.support.browser import NARROW, WIDE, AdminPage

pytestmark = [pytest.mark.browser, pytest.mark.processes]

MODEL = "llama3.2"
#: The page's session storage key for the token: the contract's name and the page's path.
TOKEN_KEY = "gateway.admin.token:/admin/"
MARKUP = "<img src=x onerror=alert(1)>"


def _status(stack: Stack, secret: str, model: str = MODEL) -> int:
    """What the gateway answers the `ollama` client generating with this key: 200 or the error."""
    headers = {"Authorization": f"Bearer {secret}"}
    try:
        with ollama.Client(host=stack.url, headers=headers) as client:
            answer = client.generate(model=model, prompt="hi")
    except ollama.ResponseError as exc:
        return exc.status_code
    assert answer.response, "an empty answer"
    return 200


def _create(page: AdminPage, name: str, *, model: str | None = None, rpm: int | None = None) -> str:
    """Create a key through the form; return its secret, read from the dialog."""
    page.click("key-new")
    page.wait(lambda: page.shown("create-name"), "the new-key form")
    page.type("create-name", name)
    if model is not None:
        page.el("create-models-some").click()
        ticks = page.css(f'#key-create input[name=models][value="{model}:latest"]')
        if ticks:  # the gateway lists its models: pick it
            ticks[0].click()
        else:  # it does not: type it
            page.type("create-models-other", model)
    if rpm is not None:
        page.type("create-rpm", str(rpm))
    page.click("key-create-submit")
    return page.secret_from_dialog()


def _key_id(secret: str) -> str:
    return secret.split("_")[1]  # gw_<id>_<secret>


def _cells(row: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [str(cell.text) for cell in row.find_elements(By.CSS_SELECTOR, "th, td")]


def _usage_rows(page: AdminPage, key_id: str) -> list[list[str]]:
    """The usage table's rows of this key, each as its cells' text."""
    from selenium.webdriver.common.by import By

    rows = page.css("#usage-table tbody tr")
    return [
        [str(cell.text) for cell in row.find_elements(By.TAG_NAME, "td")]
        for row in rows
        if key_id in row.text
    ]


def _show_usage_until(page: AdminPage, key_id: str, requests: int) -> list[str]:
    """Ask for usage until the key's llama3.2 row counts `requests` (the sink flushes each 0.3 s).

    Returns that row's cells; requests refused before naming a model have a row of their own
    (model `-`).
    """

    def counted() -> list[str] | None:
        page.click("usage-show")
        page.wait(lambda: page.text("usage-message") != "Loading…", "usage loaded")
        for row in _usage_rows(page, key_id):
            if row[2] == "llama3.2:latest" and int(row[3].replace(",", "")) >= requests:
                return row
        return None

    return page.wait(counted, f"usage of {requests} requests")


def _live_check(page: AdminPage, stack: Stack, secret: str) -> None:
    """While a slow answer streams, the live view shows it in flight (if this gateway has one)."""
    page.tab("live")
    if not stack.has("/live"):
        page.wait(
            lambda: "not available on this gateway" in page.text("live-message"),
            "the live view saying it is not available",
        )
        return
    config = stack.emulator.config
    tokens, gap = config.tokens, config.inter_token
    config.tokens, config.inter_token = 400, 0.05  # about 20 s of streaming
    stop = threading.Event()

    def stream() -> None:
        headers = {"Authorization": f"Bearer {secret}"}
        with ollama.Client(host=stack.url, headers=headers) as client:
            for _ in client.generate(model=MODEL, prompt="hi", stream=True):
                if stop.is_set():
                    break

    worker = threading.Thread(target=stream)
    worker.start()
    try:
        page.wait(lambda: _key_id(secret) in page.text("live-body"), "the stream in the live view")
        page.screenshot("live")
    finally:
        stop.set()
        worker.join(60)
        config.tokens, config.inter_token = tokens, gap


def test_a_new_admin_creates_uses_rotates_and_revokes_a_key(page: AdminPage, stack: Stack) -> None:
    page.sign_in(stack.token())
    assert page.text("who-text").startswith("Signed in as alice@example.com (admin)")

    secret = _create(page, "team-a", model=MODEL, rpm=5)
    key_id = _key_id(secret)
    page.screenshot("secret")
    # The copy button puts the secret on the clipboard (permission granted as a user would).
    page.driver.execute_cdp_cmd(
        "Browser.grantPermissions",
        {"origin": stack.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
    )
    page.click("secret-copy")
    page.wait(lambda: page.text("secret-copied") == "Copied to the clipboard.", "copied")
    clipboard = page.driver.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], (e) => arguments[0](String(e)))"
    )
    assert clipboard == secret
    # Shown once: not in the URL, the title or the tab's storage, and gone with the dialog.
    assert secret not in page.driver.current_url
    assert secret not in page.driver.title
    assert secret not in page.run("return JSON.stringify(sessionStorage)")
    page.close_secret()
    assert page.el("secret-value").get_attribute("value") == ""
    assert secret not in page.driver.page_source

    key = stack.api("GET", f"/keys/{key_id}")
    assert (key["name"], key["rpm"]) == ("team-a", 5)
    assert key["models"] in (["llama3.2"], ["llama3.2:latest"])
    row = page.wait(lambda: page.key_row(key_id), "the new key in the list")
    assert "RPM: 5" in row.text
    # Marked in the list; the filters stay as the user left them (empty), not set to its name.
    page.wait(
        lambda: page.text("keys-message") == "Created key team-a (marked in the list).",
        "the new key marked",
    )
    assert "just-created" in page.key_row(key_id).get_attribute("class")
    assert page.el("keys-name").get_attribute("value") == ""
    page.screenshot("keys")

    _live_check(page, stack, secret)  # one request (or none) so far
    page.tab("keys")
    statuses = [_status(stack, secret) for _ in range(6)]
    used = 1 if stack.has("/live") else 0
    assert statuses == [200] * (5 - used) + [429] * (1 + used)  # RPM 5 over the minute

    # Edit: only what changed is sent (the audit entry records the one field).
    page.key_action(key_id, "edit")
    page.wait(lambda: page.shown("edit-dialog"), "the edit dialog")
    assert page.el("edit-name").get_attribute("value") == "team-a"
    page.type("edit-rpm", "100")
    page.screenshot("edit")
    page.click("edit-save")
    page.wait(lambda: not page.shown("edit-dialog"), "the edit saved")
    page.wait(lambda: "RPM: 100" in page.key_row(key_id).text, "the new limit shown")
    update = stack.api("GET", "/audit", params={"key_id": key_id, "action": "update"})["data"]
    assert [entry["changes"] for entry in update] == [{"rpm": {"before": 5, "after": 100}}]
    assert _status(stack, secret) == 200
    assert _status(stack, secret, "qwen2.5:7b") == 403  # not a model it may use

    page.tab("usage")
    row = _show_usage_until(page, key_id, requests=6)
    assert row[1].startswith("team-a")
    totals = stack.api("GET", f"/keys/{key_id}/usage")["totals"]
    page.click("usage-show")
    page.wait(lambda: _usage_rows(page, key_id), "the usage row")
    shown = _usage_rows(page, key_id)
    assert sum(int(row[3].replace(",", "")) for row in shown) == totals["requests"]
    page.wait(lambda: len(page.css("#usage-charts svg .bar")) >= 30, "the usage charts")
    page.screenshot("usage")

    # Rotate with a grace period: both secrets work, then only the new one.
    page.tab("keys")
    page.key_action(key_id, "rotate")
    page.wait(lambda: page.shown("rotate-dialog"), "the rotate dialog")
    page.type("rotate-grace", "15")
    page.screenshot("rotate")
    page.click("rotate-confirm")
    new_secret = page.secret_from_dialog()
    assert new_secret != secret
    assert _key_id(new_secret) == key_id
    page.close_secret()
    assert _status(stack, new_secret) == 200
    assert _status(stack, secret) == 200  # within its 15 s of grace
    page.wait(lambda: _status(stack, secret) == 401, "the old secret refused after the grace", 90)
    assert _status(stack, new_secret) == 200

    # Revoke, confirmed: the next request is refused.
    page.key_action(key_id, "revoke")
    page.wait(lambda: page.shown("revoke-dialog"), "the revoke confirmation")
    assert "team-a" in page.text("revoke-title")
    page.screenshot("revoke")
    page.click("revoke-confirm")
    page.wait(lambda: "revoked" in page.key_row(key_id).text, "the key shown revoked")
    assert _status(stack, new_secret) == 401

    page.tab("audit")
    page.type("audit-key", key_id)
    page.click("audit-search")

    def actions() -> list[str]:
        from selenium.webdriver.common.by import By

        return [
            str(row.find_elements(By.TAG_NAME, "td")[2].text)
            for row in page.css("#audit-table tbody tr")
        ]

    page.wait(lambda: actions() == ["create", "update", "rotate", "revoke"], "the audit trail")
    assert all("alice@example.com" in row.text for row in page.css("#audit-table tbody tr"))
    assert "rpm: 5 → 100" in page.css("#audit-table tbody tr")[1].text
    page.screenshot("audit")
    assert page.csp_violations() == []


def test_the_usage_csv_is_the_table_s_rows(page: AdminPage, stack: Stack, tmp_path: Path) -> None:
    made = stack.api("POST", "/keys", json={"name": '=HYPERLINK("x"),"quoted"'})
    secret, key_id = made["secret"], made["key"]["id"]
    assert _status(stack, secret) == 200
    page.driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)}
    )
    page.sign_in(stack.token("read"))
    page.tab("usage")
    page.type("usage-key", key_id)
    _show_usage_until(page, key_id, requests=1)
    page.click("usage-csv")
    files = page.wait(lambda: list(tmp_path.glob("usage-*.csv")), "the CSV file")
    text = files[0].read_text(encoding="utf-8")
    # Every field quoted: a spreadsheet splitting on `;` (its locale's separator) cannot cut
    # one into a formula cell.
    for line in text.splitlines():
        assert line.startswith('"')
        assert line.endswith('"')
    rows = list(csv.DictReader(io.StringIO(text)))
    report = stack.api("GET", "/usage", params={"key_id": key_id})
    assert [row["key_id"] for row in rows] == [row["key_id"] for row in report["rows"]]
    assert [int(row["requests"]) for row in rows] == [row["requests"] for row in report["rows"]]
    # A name a spreadsheet would run as a formula is kept as text (OWASP "CSV injection").
    assert rows[0]["name"] == "'" + '=HYPERLINK("x"),"quoted"'


#: csvField's answers (usage.js), by OWASP's CSV injection guidance: every field quoted, a
#: formula's first character (after spaces) defused with `'`, plain numbers and "-" kept.
CSV_FIELDS = [
    ("plain", '"plain"'),
    ("x;=1+1", '"x;=1+1"'),
    ("=1+1", '"\'=1+1"'),
    ("  =1+1", '"\'  =1+1"'),
    ("+cmd", '"\'+cmd"'),
    ("-2+3", '"\'-2+3"'),
    ("@SUM(A1)", '"\'@SUM(A1)"'),
    ("\tx", '"\'\tx"'),
    ("\rx", '"\'\rx"'),
    ("\uff1d1+1", '"\'\uff1d1+1"'),
    ("\uff0bx", '"\'\uff0bx"'),
    ("\uff0dx", '"\'\uff0dx"'),
    ("\uff20x", '"\'\uff20x"'),
    ("|calc", '"\'|calc"'),
    ('say "hi"', '"say ""hi"""'),
    ("-", '"-"'),
    ("-5", '"-5"'),
    ("+1.5e3", '"+1.5e3"'),
    (" -0.25", '" -0.25"'),
    (42, '"42"'),
    (None, '""'),
]


def test_csv_fields_are_quoted_and_formulas_defused(page: AdminPage, stack: Stack) -> None:
    # The module the page runs, imported in the page (same origin: the CSP allows it).
    answers = page.driver.execute_async_script(
        """
        const [cases, done] = arguments;
        Promise.all([import(new URL('ui/usage.js', location.href)),
                     import(new URL('ui/dom.js', location.href))])
          .then(([usage, dom]) => done({
            csv: cases.map((value) => usage.csvField(value)),
            plural: [dom.plural(0, 'request'), dom.plural(1, 'request'), dom.plural(2, 'error')],
          }), (error) => done({error: String(error)}));
        """,
        [value for value, _ in CSV_FIELDS],
    )
    assert "error" not in answers, answers
    assert list(zip([v for v, _ in CSV_FIELDS], answers["csv"], strict=True)) == [
        (value, quoted) for value, quoted in CSV_FIELDS
    ]
    assert answers["plural"] == ["0 requests", "1 request", "2 errors"]


def test_each_page_path_keeps_its_own_sign_in(page: AdminPage, stack: Stack) -> None:
    # Two gateways on one origin behind path prefixes share sessionStorage: the page's keys
    # carry its path, so a token kept for /other/admin/ does not sign this page in.
    session = {"token": stack.token(), "expires_at": None, "subject": "x", "scopes": ["admin"]}
    page.run(
        "sessionStorage.setItem('gateway.admin.token:/other/admin/', arguments[0])",
        json.dumps(session),
    )
    page.driver.refresh()
    page.wait(lambda: page.shown("signin"), "the sign-in screen")
    assert not page.shown("tabs")
    page.sign_in(stack.token())
    keys = set(page.run("return Object.keys(sessionStorage)"))
    assert keys == {TOKEN_KEY, "gateway.admin.tab:/admin/", "gateway.admin.token:/other/admin/"}
    other = page.run("return sessionStorage.getItem('gateway.admin.token:/other/admin/')")
    assert json.loads(other) == session  # the other page's, untouched


def test_a_read_token_sees_no_write_controls(page: AdminPage, stack: Stack) -> None:
    key_id = stack.api("POST", "/keys", json={"name": "seen-by-reader"})["key"]["id"]
    page.sign_in(stack.token("read", subject="bob@example.com"))
    assert "(read only)" in page.text("who-text")
    page.type("keys-name", "seen-by-reader")
    row = page.wait(lambda: page.key_row(key_id), "the key listed")
    assert row.find_elements("css selector", "button") == []
    assert not page.shown("key-new")
    assert not page.shown("key-create")
    assert [th.text for th in page.css("#keys-table thead th") if th.is_displayed()][-1] == (
        "Created"
    )
    visible = [button.text for button in page.css("button") if button.is_displayed()]
    assert set(visible) <= {"Sign out", "Keys", "Usage", "Live", "Audit", "Search"} | {
        "Previous page",
        "Next page",
    }
    page.screenshot("read-only")


def test_markup_in_a_key_name_shows_as_those_characters(page: AdminPage, stack: Stack) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    made = stack.api("POST", "/keys", json={"name": MARKUP})
    key_id, secret = made["key"]["id"], made["secret"]
    assert _status(stack, secret) == 200
    page.sign_in(stack.token())
    page.type("keys-name", "onerror")
    page.wait(lambda: _cells(page.key_row(key_id))[0] == MARKUP, "the key listed")
    page.key_action(key_id, "revoke")
    page.wait(lambda: page.shown("revoke-dialog"), "the revoke confirmation")
    assert page.text("revoke-title") == f"Revoke key {MARKUP}?"
    page.click("revoke-cancel")
    page.tab("usage")
    page.type("usage-key", key_id)
    assert _show_usage_until(page, key_id, requests=1)[1].startswith(MARKUP)
    # The only image is the page's logo; no script ran (an alert would be open).
    assert [img.get_attribute("src") for img in page.css("img")] == [
        f"{stack.url}/admin/ui/favicon.svg"
    ]
    with pytest.raises(NoAlertPresentException):
        page.driver.switch_to.alert.text  # noqa: B018 - raises when no alert is open
    assert page.csp_violations() == []


def test_the_page_has_its_csp_and_refuses_to_be_framed(page: AdminPage, stack: Stack) -> None:
    for path in ("/admin/", "/admin/ui/app.js", "/admin/ui/app.css"):
        response = httpx.get(f"{stack.url}{path}", timeout=30)
        assert response.status_code == 200
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert response.headers["x-frame-options"] == "DENY"
    page.sign_in(stack.token())
    for name in ("usage", "live", "audit", "keys"):
        page.tab(name)
    assert page.csp_violations() == []
    assert not [entry for entry in page.console() if "Refused" in str(entry["message"])]

    # Another origin frames the page: the browser refuses (and says why in its console).
    framing = f'<iframe src="{stack.url}/admin/" title="framed"></iframe>'

    async def other_site(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/html")],
            }
        )
        await send({"type": "http.response.body", "body": framing.encode()})

    with LoopbackServer(other_site) as site:
        page.driver.get(site.url)
        page.wait(
            lambda: any("frame-ancestors" in message for message in page.csp_violations()),
            "the browser refusing the frame",
        )
        page.driver.switch_to.frame(page.css("iframe")[0])
        assert page.css("#token-input") == []  # nothing of the page inside the frame
        page.driver.switch_to.default_content()


def test_the_page_reads_well_at_375_and_1440_pixels(page: AdminPage, stack: Stack) -> None:
    stack.api("POST", "/keys", json={"name": "a-key-with-a-rather-long-name-for-a-phone-screen"})
    page.sign_in(stack.token())
    for width, height in (NARROW, WIDE):
        for dark in (False, True):
            page.viewport(width, height, dark=dark)
            for name in ("keys", "usage", "live", "audit"):
                page.tab(name)
                if name == "usage":
                    page.click("usage-show")
                    page.wait(lambda: page.css("#usage-charts svg"), "the charts")
                assert page.no_horizontal_scroll(), (width, name)
                if name == "audit":
                    _action_boxes_beside_their_words(page)
                    if width == NARROW[0] and not dark:
                        page.screenshot("audit-375")
            page.tab("keys")
            page.wait(lambda: page.css("#keys-table tbody tr"), "the keys")
            if width == NARROW[0]:
                page.screenshot("keys-375-dark" if dark else "keys-375")
            page.click("key-new")
            page.wait(lambda: page.shown("create-name"), "the new-key form")
            assert page.no_horizontal_scroll(), (width, "new key")
            if width == WIDE[0] and dark:
                page.screenshot("keys-dark")
            page.click("key-create-cancel")
    background = page.run("return getComputedStyle(document.documentElement).backgroundColor")
    page.viewport(*WIDE, dark=False)
    assert page.run("return getComputedStyle(document.documentElement).backgroundColor") != (
        background
    )  # the dark scheme is another colour


def _action_boxes_beside_their_words(page: AdminPage) -> None:
    """Each action checkbox of the audit filter sits just left of its word, on one line."""
    boxes = page.run(
        """
        return [...document.querySelectorAll('#audit-form fieldset.inline label')].map((label) => {
          const box = label.querySelector('input').getBoundingClientRect();
          const range = document.createRange();
          range.selectNodeContents(label.lastChild);
          const words = range.getClientRects();
          return {word: label.textContent.trim(), lines: words.length,
                  gap: words[0].left - box.right, height: label.getBoundingClientRect().height};
        });
        """
    )
    assert [box["word"] for box in boxes] == ["create", "update", "revoke", "rotate"]
    for box in boxes:
        assert box["lines"] == 1, box  # not broken mid-word
        assert 0 <= box["gap"] < 16, box  # beside its box, not across the screen


def test_every_control_has_an_accessible_name(page: AdminPage, stack: Stack) -> None:
    stack.api("POST", "/keys", json={"name": "named-controls"})
    page.sign_in(stack.token())
    page.type("keys-name", "named-controls")
    page.wait(lambda: page.css("#keys-table tbody button"), "the key's buttons")
    page.click("key-new")
    page.wait(lambda: page.shown("create-name"), "the new-key form")

    def unnamed() -> tuple[int, list[str]]:
        """How many controls are shown, and those without a name (sections reload: retried)."""
        controls = [
            control
            for control in page.css("button, input, select, textarea, a[href]")
            if control.is_displayed()
        ]
        names = [(c.accessible_name.strip(), c.get_attribute("outerHTML")) for c in controls]
        return len(controls), [markup for name, markup in names if not name]

    for name in ("keys", "usage", "audit"):
        page.tab(name)
        shown, missing = page.wait(unnamed, "the controls")
        assert shown > 5
        assert missing == [], name
    # From the keyboard: the tabs move with the arrow keys, as WAI-ARIA's tab pattern.
    from selenium.webdriver.common.keys import Keys

    page.el("tab-audit").send_keys(Keys.ARROW_RIGHT)
    page.wait(lambda: page.shown("panel-keys"), "the arrow key wrapping to Keys")
    assert page.driver.switch_to.active_element.get_attribute("id") == "tab-keys"


def test_an_expired_token_mid_form_keeps_the_form(page: AdminPage, stack: Stack) -> None:
    started = time.time()
    page.sign_in(stack.token(ttl=12))
    page.click("key-new")
    page.wait(lambda: page.shown("create-name"), "the new-key form")
    page.type("create-name", "made-after-sign-in-again")
    page.type("create-tpm", "777")
    page.wait(lambda: time.time() > started + 13, "the token expired", 60)
    page.click("key-create-submit")
    page.wait(lambda: page.shown("reauth-dialog"), "the sign-in dialog")
    assert page.text("reauth-reason") == "token expired"
    assert page.el("create-name").get_attribute("value") == "made-after-sign-in-again"
    page.screenshot("sign-in-again")
    page.type("reauth-token", "not-a-token")
    page.click("reauth-sign-in")
    page.wait(lambda: page.text("reauth-error") == "malformed token", "the refusal shown")
    assert "not-a-token" not in page.driver.current_url
    page.type("reauth-token", stack.token())
    page.click("reauth-sign-in")
    secret = page.secret_from_dialog()  # the create was sent again, with what was typed
    key = stack.api("GET", f"/keys/{_key_id(secret)}")
    assert (key["name"], key["tpm"]) == ("made-after-sign-in-again", 777)
    page.close_secret()


def test_a_refused_token_is_explained_and_sign_out_forgets_the_token(
    page: AdminPage, stack: Stack
) -> None:
    # The token field is masked and not remembered; no empty note above the form.
    assert page.el("token-input").get_attribute("type") == "password"
    assert page.el("token-input").get_attribute("autocomplete") == "off"
    assert not page.shown("signin-note")
    page.type("token-input", "gw_0123456789ab_notanadmintoken")
    page.click("token-sign-in")
    page.wait(lambda: page.shown("signin-error"), "the refusal")
    assert "API keys cannot open the admin API" in page.text("signin-error")
    assert page.driver.current_url == f"{stack.url}/admin/"
    token = stack.token()
    page.sign_in(token)
    stored = page.run(f"return sessionStorage.getItem('{TOKEN_KEY}')")
    assert token in stored
    assert page.run("return document.cookie") == ""
    assert page.run("return localStorage.length") == 0
    page.driver.refresh()  # the tab keeps its session across a reload
    page.wait(lambda: page.shown("tabs"), "still signed in")
    # Filters typed before signing out are not left for the next person at this browser.
    page.type("keys-name", "someone-else-s-search")
    page.tab("audit")
    page.type("audit-actor", "bob")
    page.css('#audit-form input[value="revoke"]')[0].click()
    page.tab("usage")
    page.type("usage-key", "0123456789ab")
    page.click("sign-out")
    page.wait(lambda: page.shown("signin"), "the sign-in screen")
    assert page.run(f"return sessionStorage.getItem('{TOKEN_KEY}')") is None
    assert page.css("#keys-table tbody tr") == []
    for field in ("keys-name", "audit-actor", "usage-key"):
        assert page.el(field).get_attribute("value") == "", field
    assert not page.css('#audit-form input[value="revoke"]')[0].is_selected()
    assert not page.shown("sso-sign-in")  # no single sign-on configured on this gateway


def test_keys_page_through_with_the_cursor_and_filter(page: AdminPage, stack: Stack) -> None:
    token = stack.token()
    ids = [
        stack.api("POST", "/keys", token=token, json={"name": f"paged-{n:02}"})["key"]["id"]
        for n in range(55)
    ]
    stack.api("POST", f"/keys/{ids[3]}/revoke", token=token)
    page.sign_in(token)

    def shown_ids() -> list[str]:
        return [row.get_attribute("data-key-id") for row in page.css("#keys-table tbody tr")]

    page.type("keys-name", "paged-")
    page.click("keys-search")
    page.wait(lambda: shown_ids() == ids[:50], "the first page")
    assert page.text("keys-page") == "Keys 1\N{EN DASH}50"
    page.click("keys-next")
    page.wait(lambda: shown_ids() == ids[50:], "the second page")
    assert page.text("keys-page") == "Keys 51\N{EN DASH}55"
    assert not page.el("keys-next").is_enabled()
    page.click("keys-prev")
    page.wait(lambda: shown_ids() == ids[:50], "back to the first page")
    from selenium.webdriver.support.ui import Select

    Select(page.el("keys-status")).select_by_value("revoked")
    page.wait(lambda: shown_ids() == [ids[3]], "only the revoked key")

"""Signing in through the identity provider: the local Keycloak (infra/local/keycloak.sh, realm
infra/local/keycloak/realm-parley.json), headless Chromium, and the suite's edges.

The realm's people: ada (parley-admins, parley-enterprise), mia (parley-pro), otto (no group), aud
(parley-auditors). The default role map makes ada an admin on enterprise, mia a member on pro, otto a member on
free and aud an auditor.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from .conftest import SESSION_CHECK_S, chat_turn, wait_for
from .test_frontend import answer_when, finished, send

PASSWORDS = {"ada": "ada-local-pw", "mia": "mia-local-pw", "otto": "otto-local-pw", "aud": "aud-local-pw"}


@pytest.fixture(scope="module")
def idp(live) -> str:
    return live.identity_provider()


def sign_in(chromium, live, username: str, callbacks: list[str] | None = None):
    """A fresh browser: the app's sign-in screen, the provider's login form, back in the app."""
    context = chromium.new_context()
    page = context.new_page()
    if callbacks is not None:
        page.on("request", lambda r: "/auth/callback" in r.url and callbacks.append(r.url))
    page.goto(live.url + "/")
    page.click("#signin-provider")
    page.wait_for_selector("#username", timeout=30_000)
    page.fill("#username", username)
    page.fill("#password", PASSWORDS[username])
    page.click("#kc-login")
    try:
        page.wait_for_selector("#app:not([hidden])", timeout=30_000)
    except Exception:
        raise AssertionError(f"not signed in: at {page.url}: {page.inner_text('body')[:500]}") from None
    return page


def session_cookie(page) -> dict:
    return next(c for c in page.context.cookies() if c["name"] == "parley_session")


def as_browser(live, page, csrf: str | None = None) -> httpx.Client:
    """A client carrying the page's session cookie (and, given, its CSRF token), as the page's script would."""
    headers = {"Cookie": f"parley_session={session_cookie(page)['value']}"}
    if csrf:
        headers["X-CSRF-Token"] = csrf
    return httpx.Client(base_url=live.url, headers=headers, timeout=60)


def me(page) -> dict:
    return page.evaluate("() => fetch('/v1/me').then((r) => r.json())")


def keycloak_admin(idp: str) -> httpx.Client:
    token = httpx.post(
        f"{idp}/realms/master/protocol/openid-connect/token",
        data={
            "grant_type": "password",
            "client_id": "admin-cli",
            "username": "admin",
            "password": "parley-local-admin",
        },
    ).json()["access_token"]
    return httpx.Client(base_url=f"{idp}/admin/realms/parley", headers={"Authorization": f"Bearer {token}"})


def test_a_person_signs_in_through_the_provider_and_chats_with_the_role_and_tier_of_their_groups(live, chromium, idp):
    page = sign_in(chromium, live, "mia")
    assert page.inner_text("#who") == "mia · pro"
    cookie = session_cookie(page)
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Lax"
    assert page.evaluate("() => document.cookie") == "", "the page's script sees no session"
    send(page, "Say hello in three words.")
    done = answer_when(page, finished)
    assert done["status"] == "done" and done["text"].strip()
    mia = me(page)
    assert (mia["role"], mia["tier"], mia["admin"]) == ("member", "pro", False) and mia["csrf_token"]

    admin = sign_in(chromium, live, "ada")
    ada = me(admin)
    assert (ada["role"], ada["tier"], ada["admin"]) == ("admin", "enterprise", True)
    assert admin.inner_text("#who") == "ada · enterprise"
    # the admin's limits routes take the session (with its CSRF token), and each change is on the record
    with as_browser(live, admin, ada["csrf_token"]) as browser:
        assert browser.get("/v1/admin/limits").status_code == 200
    page.context.close()
    admin.context.close()


def test_changes_need_the_sessions_csrf_token_and_sign_out_ends_the_session_everywhere(live, chromium, idp):
    callbacks: list[str] = []
    page = sign_in(chromium, live, "otto", callbacks)
    token = me(page)["csrf_token"]
    assert me(page)["tier"] == "free"
    with as_browser(live, page) as bare, as_browser(live, page, "x" * len(token)) as forged:
        for client in (bare, forged):
            refused = client.post("/v1/chats", json={"title": "csrf"})
            assert (refused.status_code, refused.json()["error"]["code"]) == (403, "csrf_failed")
        assert bare.get("/v1/chats").json()["data"] == [], "nothing was made"
    with as_browser(live, page, token) as browser:
        made = browser.post("/v1/chats", json={"title": "mine"})
        assert made.status_code == 201, made.text
        chat = made.json()["id"]
        events = chat_turn(browser, chat, "Hi.", max_tokens=4)
        assert events[-1]["event"] == "run.completed"

    # the callback replayed (the provider's code, our state, this browser's cookie) is refused: state taken
    [callback] = callbacks
    state = parse_qs(urlsplit(callback).query)["state"][0]
    replayed = httpx.get(callback, cookies={"parley_signin": state}, follow_redirects=False)
    assert (replayed.status_code, replayed.json()["error"]["code"]) == (400, "state_mismatch")
    other = httpx.get(callback, cookies={"parley_signin": "another-browser"}, follow_redirects=False)
    assert (other.status_code, other.json()["error"]["code"]) == (400, "state_mismatch")

    # sign-out ends this session on every replica: the old cookie is refused on both edges
    second = sign_in(chromium, live, "otto")
    with as_browser(live, page, token) as browser:
        out = browser.post("/auth/logout?everywhere=true")
        assert out.status_code == 200 and out.json()["provider_logout"].startswith(idp)
    for replica in (0, 1):
        for old in (page, second):
            with live.client(replica=replica) as client:
                cookie = {"Cookie": f"parley_session={session_cookie(old)['value']}"}
                gone = client.get("/v1/me", headers=cookie)
                assert (gone.status_code, gone.json()["error"]["code"]) == (401, "session_ended")
    page.reload()
    page.wait_for_selector("#signin:not([hidden])", timeout=20_000)
    page.context.close()
    second.context.close()


def test_a_person_disabled_at_the_provider_loses_access_within_the_session_check(live, chromium, idp):
    page = sign_in(chromium, live, "otto")
    with keycloak_admin(idp) as kc:
        [otto] = kc.get("/users", params={"username": "otto", "exact": "true"}).json()
        assert kc.put(f"/users/{otto['id']}", json={**otto, "enabled": False}).status_code == 204
        disabled_at = time.monotonic()
        try:
            with as_browser(live, page) as browser:
                ended = wait_for(lambda: browser.get("/v1/me").status_code == 401, SESSION_CHECK_S + 20, 0.2)
                took = time.monotonic() - disabled_at
                assert ended, "the session outlived the person's access"
                gone = browser.get("/v1/me").json()["error"]
                assert gone["code"] == "session_ended"
            print(f"access ended {took:.1f} s after the provider disabled the person (check every {SESSION_CHECK_S} s)")
            assert took <= SESSION_CHECK_S + 5
        finally:
            kc.put(f"/users/{otto['id']}", json={**otto, "enabled": True})
    page.context.close()


def test_an_admins_read_of_another_persons_run_is_on_the_audit_record_which_only_owner_and_auditors_read(
    live, chromium, idp
):
    member = live.token(f"audited-{uuid.uuid4().hex[:6]}")
    with live.client(member) as client:
        chat = client.post("/v1/chats", json={"title": "private"}).json()["id"]
        run = chat_turn(client, chat, "A private question.", max_tokens=4)[0]["data"]["run_id"]
    admin = sign_in(chromium, live, "ada")
    ada = me(admin)
    with as_browser(live, admin) as browser:
        assert browser.get(f"/v1/admin/runs/{run}").status_code == 200
        refused = browser.get("/v1/admin/audit")
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "auditor_required")
    with live.client(member) as client:
        assert client.get("/v1/admin/audit").status_code == 403
    auditor = sign_in(chromium, live, "aud")
    assert me(auditor)["role"] == "auditor"
    with as_browser(live, auditor) as browser:
        assert browser.get(f"/v1/admin/runs/{run}").status_code == 403, "an auditor reads the record, not runs"

        def read_of_run() -> list[dict]:
            rows = browser.get("/v1/admin/audit", params={"actor": ada["user_id"], "action": "read.run"})
            assert rows.status_code == 200, rows.text
            return [r for r in rows.json()["data"] if r["resource"] == run]

        [entry] = wait_for(read_of_run, 30)
    user_id = member_id(live, member)
    assert (entry["actor_role"], entry["target_user"], entry["from_addr"]) == ("admin", user_id, "127.0.0.1")
    admin.context.close()
    auditor.context.close()


def member_id(live, token: str) -> str:
    with live.client(token) as client:
        return str(client.get("/v1/me").json()["user_id"])


BODIES = {
    "ChatPatch": {"title": "walked"},
    "NewMessage": {"content": "walked"},
    "MessagePatch": {"content": "walked"},
    "NewFeedback": {"rating": "down"},
    "LimitsPatch": {"max_concurrent": 1},
    "PolicyBody": {"version": "walked", "rules": []},
    "MemoryIn": {"content": "I walked here."},
    "ToolServerIn": {"url": "http://127.0.0.1:9/mcp"},
}


def test_every_route_answers_another_member_and_an_auditor_404_or_403_where_the_resource_is_not_theirs(live):
    """The OpenAPI document's every route, with the resources of one member, asked by another member and by an
    auditor (and by no one): nothing of the first member's is shown or changed."""
    from api.auth import credential

    owner = f"walk-{uuid.uuid4().hex[:6]}"
    token = live.token(owner)
    with live.client(token) as mine:
        chat = mine.post("/v1/chats", json={"title": "kept"}).json()["id"]
        events = chat_turn(mine, chat, "Keep this.", max_tokens=4)
        run = events[0]["data"]["run_id"]
        messages = wait_for(lambda: len(m := mine.get(f"/v1/chats/{chat}/messages").json()["data"]) == 2 and m)
        assert messages, "the answer was never stored"
        key = mine.post("/v1/api-keys", json={"name": "kept"}).json()
        share = mine.post(f"/v1/chats/{chat}/share").json()
        memory = mine.post("/v1/me/memories", json={"content": "I keep this."}).json()
        response = mine.post("/v1/responses", json={"input": "Keep this.", "max_output_tokens": 4}).json()
        document = mine.post(f"/v1/chats/{chat}/documents", files={"file": ("kept.txt", b"Kept.")}).json()
        spec = mine.get("/openapi.json").json()
    values = {
        "chat_id": chat,
        "run_id": run,
        "message_id": messages[-1]["id"],
        "key_id": key["id"],
        "share_id": share["id"],
        "memory_id": memory["id"],
        "rid": response["id"],
        "document_id": document["id"],
        "name": "walked",  # a tool server's
        "user_id": owner,
        "tier": "free",
    }
    bodies = {**BODIES, "BranchChoice": {"message_id": messages[0]["id"]}}
    others = {
        "member": live.token(f"other-{uuid.uuid4().hex[:6]}"),
        "auditor": credential(f"auditor-{uuid.uuid4().hex[:6]}", "pro", 600, role="auditor"),
    }
    walked = 0
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        url = path.format(**values)
        for method, operation in operations.items():
            ref = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            name = (ref.get("$ref") or next((r.get("$ref", "") for r in ref.get("anyOf", [])), "")).rsplit("/", 1)[-1]
            body = bodies.get(name)
            with live.client() as anyone:
                nobody = anyone.request(method.upper(), url, json=body)
            assert nobody.status_code == 401, (method, path, nobody.status_code)
            for role, other in others.items():
                with live.client(other) as client:
                    answer = client.request(method.upper(), url, json=body)
                walked += 1
                if path == "/v1/admin/audit" and role == "auditor":
                    assert answer.status_code == 200
                elif path == "/v1/shared/{share_id}":  # shared with the deployment's people: the snapshot alone
                    assert answer.status_code == 200 and owner not in answer.text, (role, answer.text)
                    assert [m["content"] for m in answer.json()["messages"]] == [m["content"] for m in messages]
                elif path.startswith("/v1/admin") or "{" in path:
                    assert answer.status_code in (403, 404), (role, method, path, answer.status_code, answer.text)
                    assert owner not in answer.text or answer.status_code == 403, (role, method, path)
                elif method == "get":  # their own view: nothing of the first member's in it
                    assert chat not in answer.text and key["id"] not in answer.text, (role, path)
        with live.client(others["member"]) as client:
            report = client.get("/v1/usage/report", params={"user_id": owner})
            assert report.status_code == 403
    assert walked > 60
    with live.client(token) as mine:  # and all of it is as it was
        assert mine.get(f"/v1/chats/{chat}").json()["title"] == "kept"
        assert mine.get(f"/v1/chats/{chat}/messages").json()["data"] == messages
        assert [s["id"] for s in mine.get("/v1/me/shares").json()["data"]] == [share["id"]]
        assert mine.get("/v1/me/memories").json()["data"] == [memory]
        assert mine.get(f"/v1/responses/{response['id']}").json()["output"] == response["output"]
        assert [d["id"] for d in mine.get(f"/v1/chats/{chat}/documents").json()["data"]] == [document["id"]]
        assert mine.get("/v1/me", headers={"Authorization": f"Bearer {key['key']}"}).status_code == 200


def test_the_admin_area_manages_people_limits_and_policies_and_the_auditor_reads_its_record(live, chromium, idp):
    person = sign_in(chromium, live, "mia")
    mia_id = me(person)["user_id"]
    admin = sign_in(chromium, live, "ada")
    page = admin.context.new_page()
    page.goto(f"{live.url}/admin")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    row = page.locator(f"#people tr[data-user='{mia_id}']")
    assert "member" in row.inner_text() and "pro" in row.inner_text()
    # a limit changed in the browser is the limit in force
    field = page.locator("#limits tr[data-tier='free'] input[name='max_runs_per_minute']")
    before = field.input_value()
    field.fill("29")
    page.locator("#limits tr[data-tier='free'] button").click()
    page.wait_for_selector("#status:has-text('Limits of free saved')")
    with live.client(live.token(admin=True)) as root:
        assert root.get("/v1/admin/limits").json()["tiers"]["free"]["max_runs_per_minute"] == 29
        root.put("/v1/admin/limits/tiers/free", json={"max_runs_per_minute": int(float(before))})
    # disabling a person ends their session at once, on the next request
    row.get_by_role("button", name="Disable").click()
    page.wait_for_selector("#status:has-text('disabled')")
    with as_browser(live, person) as browser:
        assert browser.get("/v1/me").json()["error"]["code"] == "session_ended"
    page.locator(f"#people tr[data-user='{mia_id}']").get_by_role("button", name="Enable").click()
    page.wait_for_selector("#status:has-text('enabled')")
    assert page.locator("#audit-panel").is_hidden(), "an admin does not read the audit log"
    auditor = sign_in(chromium, live, "aud")
    record = auditor.context.new_page()
    record.goto(f"{live.url}/admin")
    record.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert record.locator("#people-panel").is_hidden()
    record.fill("#audit-action", "people.disable")
    record.click("#audit-load")
    record.wait_for_selector(f"#audit tr:has-text('{mia_id}')", timeout=20_000)
    for context in (person.context, admin.context, auditor.context):
        context.close()


def test_the_first_local_account_is_the_owner_who_makes_the_others(live, chromium):
    context = chromium.new_context()
    page = context.new_page()
    page.goto(live.url + "/")
    page.wait_for_selector("#local-owner:not([hidden])", timeout=20_000)
    page.fill("#username", "founder")
    page.fill("#password", "founder-local-password")
    page.click("#local-submit")
    page.wait_for_selector("#app:not([hidden])", timeout=20_000)
    owner = me(page)
    assert (owner["user_id"], owner["role"]) == ("founder", "owner")
    with httpx.Client(base_url=live.url) as anyone:
        second = anyone.post("/auth/local/owner", json={"username": "usurper", "password": "usurper-password"})
        assert (second.status_code, second.json()["error"]["code"]) == (409, "owner_exists")
        assert anyone.get("/auth/methods").json()["needs_owner"] is False
    with as_browser(live, page, owner["csrf_token"]) as browser:
        made = browser.post(
            "/v1/admin/local-accounts",
            json={"username": "newcomer", "password": "newcomer-password", "role": "member", "tier": "pro"},
        )
        assert made.status_code == 201, made.text
        taken = browser.post("/v1/admin/local-accounts", json={"username": "newcomer", "password": "x" * 12})
        assert (taken.status_code, taken.json()["error"]["code"]) == (409, "username_taken")
    with httpx.Client(base_url=live.url) as anyone:
        for name, password in (("newcomer", "not-the-password"), ("nobody", "newcomer-password")):
            wrong = anyone.post("/auth/local/login", json={"username": name, "password": password})
            assert (wrong.status_code, wrong.json()["error"]["code"]) == (401, "invalid_credentials")
            assert "parley_session" not in wrong.headers.get("set-cookie", "")
        right = anyone.post("/auth/local/login", json={"username": "newcomer", "password": "newcomer-password"})
        assert right.status_code == 200 and (right.json()["role"], right.json()["tier"]) == ("member", "pro")
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "Secure" in cookie and "SameSite=lax" in cookie
        session = cookie.split(";", 1)[0]
        member = anyone.get("/v1/me", headers={"Cookie": session}).json()
        assert (member["user_id"], member["role"]) == ("newcomer", "member")
        refused = anyone.post(
            "/v1/admin/local-accounts",
            headers={"Cookie": session, "X-CSRF-Token": member["csrf_token"]},
            json={"username": "third", "password": "third-password"},
        )
        assert refused.status_code == 403
    context.close()

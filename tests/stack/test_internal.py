"""The stack's internal surfaces answer only the stack: the metering stage's pages want the internal token,
an engine wants its consumer's key. A local process with a user's credential, or none, gets a 401."""

import httpx


def test_the_metering_stages_pages_answer_only_the_stacks_internal_token(live):
    metering = live.stage_url("metering")
    reads = ("/usage-rows/r1", "/usage/u1", "/usage-range?since=0&until=1", "/usage-report?since=0&until=1")
    user = {"Authorization": f"Bearer {live.token()}"}
    admin = {"Authorization": f"Bearer {live.token('root', admin=True)}"}
    for path in reads:
        for headers in ({}, user, admin, {"Authorization": "Bearer wrong"}):
            response = httpx.get(f"{metering}{path}", headers=headers, timeout=10)
            assert response.status_code == 401, (path, headers, response.text)
    forged = {"rows": [{"run_id": "forged", "user_id": "victim", "completion_tokens": 10**9}]}
    for path, body in (("/usage-repair", forged), ("/usage-rollup-rebuild", {"since": 0, "until": 1})):
        assert httpx.post(f"{metering}{path}", json=body, headers=user, timeout=10).status_code == 401
    assert live.usage_rows("forged") == []  # nothing was written

    with live.internal() as stack:
        assert stack.get("/usage-rows/r1").json() == {"data": []}
    assert httpx.get(f"{metering}/metrics", timeout=10).status_code == 200  # scraping and health stay open
    assert httpx.get(f"{metering}/readyz", timeout=10).status_code == 200


def test_an_engine_answers_only_its_consumer(live):
    engine = live.stack.engine_url()
    body = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
    assert httpx.post(f"{engine}/v1/chat/completions", json=body, timeout=30).status_code == 401
    assert httpx.get(f"{engine}/slots", timeout=10).status_code == 401
    keyed = httpx.post(f"{engine}/v1/chat/completions", json=body, headers=live.stack.engine_headers(), timeout=60)
    assert keyed.status_code == 200 and keyed.json()["choices"][0]["message"]["content"] is not None

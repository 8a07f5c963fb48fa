"""New sessions (issue 57, round three): cheap to make, and on a public server rate-limited per address group
(``webapp.server.newcomers``). The bucket on a clock of the test's own; the state against Gradio's own; the limit
through a Gradio app served from this process behind a pretend proxy, and through ``app.py`` as a Space runs it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import gradio as gr
import httpx
import pytest
from gradio.blocks import BlocksConfig
from gradio.state_holder import SessionState
from starlette.middleware import Middleware

from tests.net import free_port
from tests.test_app_security import App
from webapp.server import newcomers
from webapp.server.newcomers import LightState, RequestScope, SessionRate
from webapp.server.sessions import Sessions


def test_the_bucket_holds_a_burst_then_refills_at_its_rate():
    now = [100.0]
    rate = SessionRate(per_minute=60, burst=3, clock=lambda: now[0])
    assert [rate.take("203.0.113.7") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.take("203.0.113.7") == pytest.approx(1.0)  # one a second: the next in 1 s
    assert rate.take("198.51.100.9") == 0.0  # another group has its own bucket
    now[0] += 0.5
    assert rate.take("203.0.113.7") == pytest.approx(0.5)
    now[0] += 0.5
    assert rate.take("203.0.113.7") == 0.0 and rate.take("203.0.113.7") > 0
    now[0] += 3600  # full again: both groups forgotten, the table stays small
    assert rate.take("192.0.2.1") == 0.0 and len(rate) == 1


@pytest.fixture
def page() -> gr.Blocks:
    with gr.Blocks() as demo:
        box = gr.Textbox(label="in")
        out = gr.Textbox(label="out")
        gr.Slider(0, 10, value=3)
        gr.State([1, 2])
        box.submit(lambda s: s.upper(), box, out, api_name="shout")
    return demo


def test_a_new_sessions_state_builds_no_configuration_until_read_and_then_gradios(page, monkeypatch):
    """Gradio's state computes every block's configuration when the session is made (35 ms for this app's page);
    the light one none, and what it gives when read is what Gradio's gives."""
    calls = []
    original = BlocksConfig.config_for_block
    monkeypatch.setattr(BlocksConfig, "config_for_block", staticmethod(lambda *a: calls.append(a[0]) or original(*a)))
    light = LightState(page)
    assert calls == []
    gradio = SessionState(page)
    assert len(calls) == len(gradio.config_values) > 0
    assert set(vars(light)) == set(vars(gradio))  # a Gradio that adds state to sessions fails here
    key = next(iter(gradio.config_values))
    assert key in light.config_values and light.config_values[key] == gradio.config_values[key]
    assert len(calls) == len(gradio.config_values) + 1  # one block read, one computed
    light._update_value_in_config(key, "v")  # as an event's postprocessing does
    assert light.config_values[key]["props"]["value"] == "v"
    assert list(light.components)[1:] == list(gradio.components)[1:]  # a deep link reads them all, in order
    assert len(light.config_values) == len(gradio.config_values)


@pytest.fixture
def served(page, monkeypatch) -> Iterator[str]:
    """``page`` behind one pretend proxy (the right-most X-Forwarded-For entry is the address), 5 new sessions
    a minute per address."""
    monkeypatch.setenv("FORWARDED_HOPS", "1")
    page.queue()
    page.launch(
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        app_kwargs={"middleware": [Middleware(RequestScope)]},
    )
    Sessions(rate=SessionRate(per_minute=5, burst=5)).install(page)
    yield f"http://127.0.0.1:{page.server_port}/gradio_api"
    page.close()


def _run(api: str, session: str, forwarded: str) -> httpx.Response:
    body = {"data": ["hi"], "fn_index": 0, "session_hash": session}
    return httpx.post(f"{api}/run/shout", json=body, headers={"X-Forwarded-For": forwarded}, timeout=30)


def _join(api: str, session: str, forwarded: str) -> httpx.Response:
    body = {"data": ["hi"], "fn_index": 0, "session_hash": session}
    return httpx.post(f"{api}/queue/join", json=body, headers={"X-Forwarded-For": forwarded}, timeout=30)


def test_an_address_making_new_sessions_is_refused_past_its_rate_and_others_are_served(served):
    api = served
    first = uuid.uuid4().hex
    codes = [_run(api, first, "10.1.1.1, 203.0.113.7").status_code]
    for i in range(11):  # new hashes, the forged entries at the left rotated: one address still
        send = _run if i % 2 else _join
        codes.append(send(api, uuid.uuid4().hex, f"10.2.{i}.1, 203.0.113.7").status_code)
    assert codes == [200] * 5 + [429] * 7, codes
    refused = _run(api, uuid.uuid4().hex, "203.0.113.7")
    assert "Too many new sessions" in refused.json()["detail"] and int(refused.headers["retry-after"]) >= 1
    assert _run(api, first, "203.0.113.7").status_code == 200  # a session already made goes on
    assert _run(api, uuid.uuid4().hex, "198.51.100.9").status_code == 200  # another address is served
    for i in range(6):  # 6 addresses of one IPv6 /64 are one client
        codes[i] = _run(api, uuid.uuid4().hex, f"2001:db8:1:2::{i + 1:x}").status_code
    assert codes[:6] == [200] * 5 + [429]
    r = httpx.post(f"{api}/call/shout", json={"data": ["hi"]}, headers={"X-Forwarded-For": "203.0.113.7"})
    assert r.status_code == 200  # a REST call without a session keeps none, and is not counted


def test_a_space_refuses_a_flood_of_new_sessions_in_milliseconds_and_serves_another_address(tmp_path):
    """``app.py`` as on a Space: the page's cheap event with 80 new session hashes from one address; past
    ``NEW_SESSIONS_BURST`` each is refused (429) in milliseconds, and another address's page still loads."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPACE_ID", "me/vit")
        app = App(tmp_path, "http://127.0.0.1:9", "--model", "bundled", "--host", "127.0.0.1")
    try:
        api = f"{app.url}gradio_api"
        config = httpx.get(f"{app.url}config").json()
        cleared = next(i for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "cleared")
        codes, refused_s = [], []
        with httpx.Client(timeout=30) as client:
            for i in range(newcomers.NEW_SESSIONS_BURST + 20):
                body = {"data": [None, None, None], "fn_index": cleared, "session_hash": uuid.uuid4().hex}
                t0 = time.perf_counter()
                r = client.post(
                    f"{api}/run/cleared", json=body, headers={"X-Forwarded-For": f"10.0.0.{i % 200}, 203.0.113.7"}
                )
                codes.append(r.status_code)
                if r.status_code == 429:
                    refused_s.append(time.perf_counter() - t0)
            body = {"data": [None, None, None], "fn_index": cleared, "session_hash": uuid.uuid4().hex}
            other = client.post(f"{api}/run/cleared", json=body, headers={"X-Forwarded-For": "198.51.100.9"})
        assert codes.count(200) <= newcomers.NEW_SESSIONS_BURST + 2 and codes.count(429) >= 18, codes
        assert sorted(refused_s)[len(refused_s) // 2] < 0.2, refused_s  # milliseconds; 0.2 s on a loaded machine
        assert other.status_code == 200
        assert "Traceback" not in app.log.read_text()
    finally:
        app.stop()

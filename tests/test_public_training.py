"""A public server's trained models and jobs are their caller's, end to end: ``python app.py --public`` behind a
proxy (``FORWARDED_HOPS=1``: the address is the ``X-Forwarded-For`` entry the proxy appended), a model trained by
one client through ``/train`` is used by it and refused to another session and to the same session hash sent
from another address, and a REST body naming the trainer's session hash from another address cannot cancel its
job, neither through the Train tab's Cancel nor through Gradio's own cancel route."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from tests.net import free_port
from tests.test_train_tab import two_classes

ROOT = Path(__file__).resolve().parents[1]
CAT = ROOT / "examples" / "cat_chelsea.jpg"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("public")
    port, log = free_port(), tmp / "app.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "FORWARDED_HOPS": "1"}
    env["GRADIO_TEMP_DIR"] = str(tmp / "gradio")
    cmd = [sys.executable, str(ROOT / "app.py"), "--public", "--model", "bundled", "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 600  # a machine shared with other jobs can take minutes to import torch
    while time.time() < deadline and proc.poll() is None:
        try:
            httpx.get(url, timeout=5).raise_for_status()
            break
        except httpx.HTTPError:
            time.sleep(1)
    else:
        pytest.fail(f"app did not start:\n{log.read_text()}")
    yield url, log
    proc.terminate()
    proc.wait(30)


def _client(url: str, address: str) -> Client:
    return Client(url, verbose=False, headers={"X-Forwarded-For": address})


def _cancel_as(url: str, session: str, address: str) -> str:
    """``/train_cancel`` over REST, its body naming ``session``, sent from ``address``."""
    api = f"{url}gradio_api/call/train_cancel"
    headers = {"X-Forwarded-For": address}
    event = httpx.post(api, json={"data": [], "session_hash": session}, headers=headers).json()["event_id"]
    return httpx.get(f"{api}/{event}", headers=headers, timeout=60).text


def test_a_trained_model_and_its_job_are_their_callers(server, tmp_path):
    """Cancels from another address naming the owner's session hash, and from another session at the owner's
    address, are ignored (the job ends "Done", not "Cancelled"); their REST streams share the owner's session,
    whose stream may take their answers: the log holds no traceback for it."""
    url, log = server
    photos = handle_file(str(two_classes(tmp_path / "p.zip", per_class=4)))
    owner = _client(url, "10.0.0.1")
    job = owner.submit(photos, "bundled: CIFAR-10 hybrid ViT", 0.1, False, api_name="/train")
    while not any(str(u[0]).startswith(("Training", "Reading")) for u in job.outputs()):
        assert not job.done(), job.outputs()
        time.sleep(0.2)
    for session, address in ((owner.session_hash, "10.0.0.2"), ("someone-else", "10.0.0.1")):
        assert "Stopping" not in _cancel_as(url, session, address)
    _, _, summary, _, value, *_ = job.result()
    assert "Done" in summary, summary
    value = value["value"] if isinstance(value, dict) else value
    assert str(value).startswith("trained:")
    labels, *_ = owner.predict(handle_file(str(CAT)), model_choice=value, api_name="/classify")
    assert {c["label"] for c in labels["confidences"]} == {"blue", "red"}
    stranger = _client(url, "10.0.0.2")
    stranger.session_hash = owner.session_hash  # the owner's session hash, from another address
    for other in (stranger, _client(url, "10.0.0.1")):
        with pytest.raises(AppError, match="trained in another session"):
            other.predict(handle_file(str(CAT)), model_choice=value, api_name="/classify")
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    assert list((log.parent / "gradio").glob("tmp*")) == []  # Gradio's gr.File left an empty file per zip


def test_gradios_own_cancel_route_cancels_only_the_callers_events(server, tmp_path):
    """Gradio's ``/gradio_api/cancel`` cancels the running event of the session hash and listener it names, and a
    session hash is the client's to send: from another address it is refused (403) and the owner's job ends "Done"
    (before ``queueing.OwnCancels``, Gradio cancelled it: the owner's job never answered); from the owner's address
    Gradio answers it as before."""
    url, log = server
    config = httpx.get(f"{url}config", timeout=30).json()
    fn = next(d.get("id", i) for i, d in enumerate(config["dependencies"]) if d.get("api_name") == "train")
    owner = _client(url, "10.0.0.5")
    job = owner.submit(
        handle_file(str(two_classes(tmp_path / "p.zip", per_class=4))),
        "bundled: CIFAR-10 hybrid ViT",
        0.1,
        False,
        api_name="/train",
    )
    while not any(str(u[0]).startswith(("Training", "Reading")) for u in job.outputs()):
        assert not job.done(), job.outputs()
        time.sleep(0.2)
    body = {"session_hash": owner.session_hash, "fn_index": fn, "event_id": "0" * 32}
    stranger = httpx.post(f"{url}gradio_api/cancel", json=body, headers={"X-Forwarded-For": "10.0.0.6"}, timeout=30)
    assert stranger.status_code == 403, stranger.text
    _, _, summary, *_ = job.result(timeout=300)
    assert "Done" in summary, summary
    mine = httpx.post(f"{url}gradio_api/cancel", json=body, headers={"X-Forwarded-For": "10.0.0.5"}, timeout=30)
    assert mine.status_code == 200, mine.text  # nothing of its own left to cancel: Gradio's answer
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]

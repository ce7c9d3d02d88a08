"""The gateway's other clients against a real gateway and a real tower: the
JavaScript client under Node.js, and the dashboard page in headless Chromium
(Debian's, installed by `make setup`), driven by Selenium. The two need
nothing of each other: the dashboard's job is started through the command API."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.gateway_support import node_test, start_tower, wait_idle
from testbed.requirements import need

ROOT = Path(__file__).resolve().parents[2]
MODEL = "gw-smol-b"  # only this module's tower has this alias
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: A job's row on the page: its step, bar width (px) and info line, or null.
JOB_STATE = """const row = document.querySelector(arguments[0]);
return row && {step: row.dataset.step, width: parseFloat(getComputedStyle(row.querySelector('.fill')).width),
               info: row.querySelector('.job-info').textContent};"""


@pytest.fixture(scope="module")
def tower(hub):
    tower = start_tower(hub, "gw-b", MODEL, roles=("infer", "train", "sync"))
    yield tower
    hub.stop_towers([tower])


def execute(gateway, command, params):
    reply = httpx.post(gateway + "/v1/grid/execute", json={"command": command, "params": params}, timeout=120)
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines() if line]


def node(gateway, tower, phase, **env):
    """Run the phase of tests/node/client.test.mjs; its TAP output."""
    need("node", "the JavaScript client runs under Node.js")
    run = node_test("client.test.mjs", RNGRID_URL=gateway, RNGRID_MODEL=MODEL, RNGRID_TOWER=tower.name,
                    RNGRID_PHASE=phase, **env)
    assert run.returncode == 0 and "# fail 0" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


#: The training job both the Node client and the dashboard test start (tests/node/client.test.mjs has its twin).
TRAIN = {"output_alias": "gw-lora", "max_steps": 200, "seq_len": 32, "batch_size": 1,
         "target_modules": ["q_proj", "v_proj"],
         "examples": [{"messages": [{"role": "user", "content": f"What is the secret number {i}?"},
                                    {"role": "assistant", "content": "It is 42."}]} for i in range(8)]}


@pytest.fixture
def running_job(gateway, tower):
    """A training job started through the gateway's command API (as the page's
    own scripts would) and watched to its first progress; still running."""
    params = {**TRAIN, "base": MODEL, "tower": tower.name}
    job_id, deadline = None, time.monotonic() + 180
    with httpx.stream("POST", gateway + "/v1/grid/execute", json={"command": "genome/train", "params": params},
                      timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            assert time.monotonic() < deadline, "no progress within 180 s"
            event = json.loads(line) if line else {}
            job_id = event.get("job_id", job_id) if event.get("type") == "job" else job_id
            if event.get("type") == "progress":
                break  # stop watching; the job keeps running
    assert job_id and event.get("type") == "progress", event
    try:
        yield job_id
    finally:
        execute(gateway, "jobs/cancel", {"job_id": job_id, "tower": tower.name})


def test_node_client_inference(gateway, tower, hub):
    assert "# pass 5" in node(gateway, tower, "inference")
    example = subprocess.run([shutil.which("node"), str(ROOT / "clients" / "ts" / "example.js"), "Say hello."],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, RNGRID_URL=gateway, RNGRID_MODEL=MODEL, RNGRID_MAX_TOKENS="16"))
    assert example.returncode == 0 and f"tokens from {tower.name}" in example.stdout, example.stdout + example.stderr
    failed = subprocess.run([shutil.which("node"), str(ROOT / "clients" / "ts" / "example.js"), "Say hello."],
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, RNGRID_URL=gateway, RNGRID_MODEL="no-such-model"))
    assert failed.returncode == 1 and failed.stderr.count("unknown_model") == 1, failed.stderr  # the code, once
    assert wait_idle(hub, tower)


@pytest.fixture
def browser(tmp_path):
    need("chromium", "the dashboard is driven in a real browser")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never fetch a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1360,900",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout} s")


def test_dashboard_in_chromium(browser, gateway, tower, running_job, tmp_path):
    """The page lists the tower, streams a chat answer, and shows a running job move."""
    from selenium.webdriver.common.by import By
    css = lambda selector: browser.find_elements(By.CSS_SELECTOR, selector)
    browser.get(gateway + "/")
    wait_for(lambda: css(f'#towers tr[data-tower="{tower.name}"]'), 20, "the tower is not listed")
    wait_for(lambda: css(f'#models li[data-model="{MODEL}"]'), 10, "the model is not listed")
    wait_for(lambda: MODEL in browser.execute_script(
        "return [...document.querySelectorAll('#chat-model option')].map(o => o.value)"), 10, "no model to chat with")
    browser.execute_script(f"document.getElementById('chat-model').value = {json.dumps(MODEL)}")
    browser.find_element(By.ID, "chat-max").clear()
    browser.find_element(By.ID, "chat-max").send_keys("48")
    browser.find_element(By.ID, "chat-input").send_keys("Name three colors of the rainbow.")
    browser.find_element(By.ID, "chat-send").click()
    answer = lambda: (css(".msg.assistant .text") or [None])[-1]
    lengths = set()  # the answer's lengths seen while it streams in
    deadline = time.monotonic() + 60
    while not browser.find_element(By.ID, "chat-stats").text:
        assert time.monotonic() < deadline, "the answer never finished"
        assert not css(".msg.error"), [e.text for e in css(".msg.error")]
        lengths.add(len(answer().text) if answer() else 0)
        time.sleep(0.02)
    text = answer().text
    assert text.strip() and len(lengths - {0, len(text)}) >= 2, ("the answer did not stream in", lengths)

    # The page re-renders the jobs every poll: read them in one script call, never
    # through element handles that a re-render makes stale.
    job = lambda: browser.execute_script(JOB_STATE, f'.job[data-job="{running_job}"]')
    wait_for(lambda: job() and int(job()["step"]) >= 1, 30, "the job is not shown")
    first = job()
    wait_for(lambda: int(job()["step"]) > int(first["step"]), 120, "the job's bar did not move")
    # The bar's width is animated: it grows once the step did.
    wait_for(lambda: float(job()["width"]) > float(first["width"]), 10, f"the job's bar did not grow: {first}")
    assert "loss" in job()["info"], job()
    browser.save_screenshot(str(tmp_path / "dashboard.png"))
    if os.environ.get("RNGRID_DOCS_SCREENSHOT"):  # `make screenshot` refreshes docs/dashboard.png
        browser.save_screenshot(os.environ["RNGRID_DOCS_SCREENSHOT"])
    print(f"screenshot: {tmp_path / 'dashboard.png'}; answer {text!r}")


def test_node_client_trains_watches_and_cancels(gateway, tower):
    out = node(gateway, tower, "train")
    assert "# pass 1" in out
    job_id = out.split("# JOB ", 1)[1].split()[0]
    try:
        assert "# pass 1" in node(gateway, tower, "cancel", RNGRID_JOB=job_id)
    finally:
        execute(gateway, "jobs/cancel", {"job_id": job_id, "tower": tower.name})  # whatever the test left

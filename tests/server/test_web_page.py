"""The chat page at `/` in headless Chromium (Debian's chromium and chromium-driver, driven by
selenium) against `bankml serve` on the default model with an API key: a message typed on the page
is answered by a streamed reply that equals the same request answered whole, Stop ends a reply and
frees the slot, and `/` still answers Ollama's probe to clients that are not browsers.

Nothing is installed here and nothing is skipped: without chromium, chromedriver or selenium the
tests fail (scripts/test.sh installs them). Each exchange saves a screenshot and prints its path.
"""
from __future__ import annotations

import os
import time

import httpx
import pytest

from bankml.runtime.default_model import DEFAULT, DEFAULT_MODELS

KEY = "page-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
INSTALL = "apt-get install -y chromium chromium-driver; pip install -e '.[test]' (scripts/test.sh does both)"
HTML = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"     # what a browser sends

# the page's fields as the first exchange sets them; the page sends each one as a number
SETTINGS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "max_tokens": 24, "seed": 7}
QUESTION = "What is the capital of France?"
STORY = "Write a very long story about a dragon who learns to bake bread."


@pytest.fixture(scope="module")
def srv(bankml_server_factory):
    return bankml_server_factory(DEFAULT_MODELS[DEFAULT][0], "--api-key", KEY)


@pytest.fixture(scope="module")
def browser():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(p)]
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: {INSTALL}")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail(f"selenium is not installed: {INSTALL}")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1100,760", "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


# ---------------------------------------------------------------- driving the page

def until(driver, what, timeout_s: float = 60.0, message: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout_s, poll_frequency=0.05).until(lambda d: what(), message)


def fill(driver, field: str, value) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    el = driver.find_element(By.ID, field)
    el.clear()
    el.send_keys(str(value), Keys.TAB)          # leaving the field fires its change event


def click(driver, button: str) -> None:
    from selenium.webdriver.common.by import By
    driver.find_element(By.ID, button).click()


def enabled(driver, button: str) -> bool:
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, button).is_enabled()


def reply(driver) -> dict | None:
    """The last assistant bubble: its state (streaming, done, stopped, error), text, chunks, meta line."""
    return driver.execute_script("""
        const m = [...document.querySelectorAll('.msg.assistant')].pop();
        return m ? {state: m.dataset.state, text: m.querySelector('.text').textContent,
                    chunks: Number(m.dataset.chunks), meta: m.querySelector('.meta').textContent} : null;""")


def ask(driver, text: str) -> None:
    from selenium.webdriver.common.by import By
    driver.find_element(By.ID, "input").send_keys(text)
    click(driver, "send")


def open_page(driver, srv) -> None:
    """The page from a fresh start (nothing in localStorage), then the server's key typed into Settings."""
    driver.get(srv.url + "/")
    driver.execute_script("localStorage.clear()")
    driver.refresh()
    until(driver, lambda: "Invalid API Key" in driver.find_element("id", "status").text, 20,
          "the page did not say that the server wants a key")
    fill(driver, "key", KEY)
    until(driver, lambda: driver.find_element("id", "model").text.strip(), 20, "the page did not show the model")
    assert driver.find_element("id", "status").text == ""


def on_page(driver, text: str) -> bool:
    """Whether the text is shown on the page (whitespace as the browser renders it aside)."""
    shown = driver.find_element("id", "log").text
    return " ".join(text.split()) in " ".join(shown.split())


def screenshot(driver, tmp_path, name: str) -> str:
    path = str(tmp_path / f"{name}.png")
    driver.save_screenshot(path)
    print(f"screenshot: {path}")
    return path


def slots_free(srv) -> bool:
    return not any(s["is_processing"] for s in httpx.get(srv.url + "/slots", headers=AUTH).json())


# ---------------------------------------------------------------- the tests

@pytest.mark.server
def test_root_is_ollamas_probe_for_clients_and_the_page_for_browsers_without_a_key(srv):
    r = httpx.get(srv.url + "/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert r.headers["content-type"].startswith("text/plain")
    h = httpx.head(srv.url + "/")
    assert h.status_code == 200 and h.headers["content-type"].startswith("text/plain") and h.content == b""
    page = httpx.get(srv.url + "/", headers={"Accept": HTML})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>bankml chat</title>" in page.text
    assert httpx.get(srv.url + "/v1/models").status_code == 401               # the API still needs the key
    assert httpx.get(srv.url + "/v1/models", headers=AUTH).status_code == 200


@pytest.mark.server
def test_page_streams_the_answer_the_server_gives_whole(srv, browser, tmp_path):
    open_page(browser, srv)
    for field, value in SETTINGS.items():
        fill(browser, field, value)
    ask(browser, QUESTION)
    until(browser, lambda: (reply(browser) or {}).get("state") not in (None, "streaming"), 60,
          "the reply did not finish")
    shot = screenshot(browser, tmp_path, "web-page-answer")
    got = reply(browser)
    want = httpx.post(srv.url + "/v1/chat/completions", headers=AUTH, timeout=60, json={
        "messages": [{"role": "user", "content": QUESTION}], "cache_prompt": False, **SETTINGS,
    }).json()["choices"][0]["message"]["content"]
    assert got["state"] == "done", got
    assert want.strip() and got["text"] == want
    assert got["chunks"] > 1                                    # it came in pieces, as they were made
    assert on_page(browser, QUESTION) and on_page(browser, want), f"the answer is not on the page ({shot})"
    assert "tokens/s" in got["meta"]
    assert enabled(browser, "send") and not enabled(browser, "stop")


@pytest.mark.server
def test_stop_ends_the_reply_frees_the_slot_and_the_page_goes_on(srv, browser, tmp_path):
    open_page(browser, srv)
    fill(browser, "max_tokens", 2000)
    fill(browser, "seed", 3)
    ask(browser, STORY)
    until(browser, lambda: len((reply(browser) or {}).get("text", "")) >= 20, 60, "no streamed text")
    assert reply(browser)["state"] == "streaming", "the reply ended before Stop was clicked"
    assert enabled(browser, "stop") and not enabled(browser, "send")
    click(browser, "stop")
    until(browser, lambda: reply(browser)["state"] == "stopped", 10, "Stop did not end the reply")
    stopped = reply(browser)["text"]
    time.sleep(1.0)
    assert reply(browser)["text"] == stopped and stopped.strip()        # it stopped growing
    assert enabled(browser, "send") and not enabled(browser, "stop")
    deadline = time.monotonic() + 15
    while not slots_free(srv):
        assert time.monotonic() < deadline, "the slot is still generating after Stop"
        time.sleep(0.1)
    screenshot(browser, tmp_path, "web-page-stopped")

    fill(browser, "max_tokens", 8)                             # the conversation goes on after a stop
    ask(browser, "Thanks!")
    until(browser, lambda: reply(browser)["state"] != "streaming", 60, "the next reply did not finish")
    assert reply(browser)["state"] == "done" and reply(browser)["text"].strip()
    assert len(browser.find_elements("css selector", ".msg")) == 4
    click(browser, "new")
    assert browser.find_elements("css selector", ".msg") == []

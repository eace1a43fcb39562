"""The chat page of `wick serve --ui`, in headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium) against real `wick serve --ui` processes serving the default model: this module's own, without an API key,
and ../conftest.py's `keyed_server`, with one (shared with the OpenAI API tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from wick_server import API_KEY, ServerProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

if not os.path.exists(CHROMIUM):
    pytest.skip(f"the chat page tests drive {CHROMIUM}, which is missing: apt-get install -y chromium chromium-driver",
                allow_module_level=True)

# After the skip: Selenium is needed only where Chromium is.
from selenium.webdriver import Chrome, ChromeOptions, Keys  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "webui"
ANSWER_TIMEOUT = 180
_READY = re.compile(r"ready at (http://\S+) ")


class UiServer:
    """`wick serve --ui` on a port of its own choosing (--port 0, read back from its log)."""

    def __init__(self, args: list[str], log_path: Path, timeout: float = 300.0) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "wick.cli.main", "serve", "--ui", "--port", "0", "--max-model-len", "2048", *args],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"wick serve exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            match = _READY.search(self.log())
            if match and httpx.get(f"{match.group(1)}/health", timeout=10).status_code == 200:
                self.url = match.group(1)
                return
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"wick serve was not ready in {timeout}s:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log.close()
        return code


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf: str) -> Iterator[UiServer]:
    process = UiServer([], tmp_path_factory.mktemp("webui-serve") / "serve.log")
    yield process
    assert process.stop() == 0, process.log()[-4000:]


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Chrome]:
    """Headless Chromium with a fresh profile (so empty localStorage), at desktop size."""
    options = ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_window_size(1280, 800)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def wait_for(driver: Chrome, condition: Callable[[Chrome], Any], timeout: float = ANSWER_TIMEOUT,
             message: str = "") -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition, message)


def open_page(driver: Chrome, server: UiServer) -> None:
    driver.get(server.url + "/")
    wait_for(driver, lambda d: d.find_element(By.ID, "model-select").find_elements(By.TAG_NAME, "option"), 30,
             "the model picker was never filled")


def change_settings(driver: Chrome, **fields: str) -> None:
    """Opens Settings, types into the fields named by id (underscores for dashes), and closes it with Done."""
    driver.find_element(By.ID, "open-settings").click()
    for name, value in fields.items():
        field = driver.find_element(By.ID, name.replace("_", "-"))
        field.clear()
        field.send_keys(value)
    driver.find_element(By.ID, "close-settings").click()
    wait_for(driver, lambda d: not d.find_element(By.ID, "settings").is_displayed(), 10)


def send(driver: Chrome, text: str) -> None:
    prompt = driver.find_element(By.ID, "prompt")
    prompt.send_keys(text)
    prompt.send_keys(Keys.ENTER)


def answers(driver: Chrome) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#messages article.message.assistant")


def last_answer_text(driver: Chrome) -> str:
    """The last answer's text so far, read in one step: the page replaces the element when the answer ends."""
    return driver.execute_script("""
        const answers = document.querySelectorAll('#messages article.message.assistant');
        return answers.length ? answers[answers.length - 1].querySelector('.content').innerText : '';""")


def ready(driver: Chrome) -> bool:
    """The page is idle: Send is shown, Stop is not."""
    return driver.find_element(By.ID, "send").is_displayed() and not driver.find_element(By.ID, "stop").is_displayed()


def wait_until_answered(driver: Chrome, count: int) -> WebElement:
    wait_for(driver, lambda d: len(answers(d)) == count and ready(d), message="the answer never finished")
    return answers(driver)[-1]


def metric(server: UiServer, name: str) -> float:
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is missing from /metrics")


def test_page_and_assets_are_served(server: UiServer) -> None:
    page = httpx.get(server.url + "/", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for path in ("app.js", "api.js", "store.js", "markdown.js", "style.css", "vendor/marked/marked.esm.js",
                 "vendor/highlight/core.min.js", "vendor/marked/LICENSE", "vendor/highlight/LICENSE"):
        assert httpx.get(f"{server.url}/ui/{path}", timeout=10).status_code == 200, path


def test_streams_an_answer_and_keeps_it_across_reload(server: UiServer, browser: Chrome) -> None:
    open_page(browser, server)
    change_settings(browser, max_tokens="40", temperature="0")
    send(browser, "What is the capital of France?")
    assert browser.find_element(By.ID, "stop").is_displayed()
    lengths = set()
    while not ready(browser):
        lengths.add(len(last_answer_text(browser)))
        time.sleep(0.02)
    answer = wait_until_answered(browser, 1)
    text = last_answer_text(browser)
    assert text.strip()
    assert len({n for n in lengths if 0 < n < len(text)}) >= 1, f"the text did not arrive in pieces: {lengths}"
    stats = answer.find_element(By.CSS_SELECTOR, ".stats").text
    assert "first token" in stats and "tokens/s" in stats, stats
    answer.find_element(By.CSS_SELECTOR, "button.copy").click()
    wait_for(browser, lambda d: answer.find_element(By.CSS_SELECTOR, "button.copy").text == "Copied", 5)

    browser.refresh()
    open_page(browser, server)
    titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#conversation-list .open")]
    assert titles == ["What is the capital of France?"]
    assert browser.find_element(By.CSS_SELECTOR, "#messages .message.user .content").text == \
        "What is the capital of France?"
    assert last_answer_text(browser) == text
    errors = [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], "the page logged errors"


def test_stop_ends_the_stream_and_frees_the_request(server: UiServer, browser: Chrome) -> None:
    open_page(browser, server)
    change_settings(browser, max_tokens="1900", temperature="0.7")
    send(browser, "Count from 1 to 2000, one number per line, and do not stop.")
    wait_for(browser, lambda d: len(last_answer_text(d)) > 20, message="no text arrived")
    browser.find_element(By.ID, "stop").click()
    wait_for(browser, ready, 10, "the page did not become ready after Stop")
    stopped = last_answer_text(browser)
    time.sleep(1.5)
    assert last_answer_text(browser) == stopped, "the answer kept growing after Stop"
    assert "stopped" in answers(browser)[-1].find_element(By.CSS_SELECTOR, ".stats").text
    deadline = time.monotonic() + 20
    while metric(server, "wick:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert metric(server, "wick:num_requests_running") == 0, "the server kept generating after Stop"
    # The page is usable again: the next question is answered.
    change_settings(browser, max_tokens="8")
    send(browser, "Say hi.")
    assert wait_until_answered(browser, 2).find_element(By.CSS_SELECTOR, ".content").text.strip()


def test_conversations_switch_rename_and_delete(server: UiServer, browser: Chrome) -> None:
    open_page(browser, server)
    change_settings(browser, max_tokens="8")
    send(browser, "First question: name a fruit.")
    wait_until_answered(browser, 1)
    browser.find_element(By.ID, "new-chat").click()
    assert not browser.find_elements(By.CSS_SELECTOR, "#messages .message")
    send(browser, "Second question: name a colour.")
    wait_until_answered(browser, 1)

    def open_conversation(title: str) -> None:
        browser.find_element(By.XPATH, f"//ul[@id='conversation-list']//button[@class='open'][.='{title}']").click()

    def shown_question() -> str:
        return browser.find_element(By.CSS_SELECTOR, "#messages .message.user .content").text

    open_conversation("First question: name a fruit.")
    assert shown_question() == "First question: name a fruit."
    assert browser.find_element(By.ID, "chat-title").text == "First question: name a fruit."
    open_conversation("Second question: name a colour.")
    assert shown_question() == "Second question: name a colour."

    browser.find_element(By.CSS_SELECTOR, "#conversation-list li.active button.rename").click()
    rename = browser.find_element(By.CSS_SELECTOR, "#conversation-list input.rename-input")
    rename.send_keys(Keys.CONTROL, "a")
    rename.send_keys("Colours", Keys.ENTER)
    titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#conversation-list .open")]
    assert titles == ["Colours", "First question: name a fruit."]

    browser.find_element(By.CSS_SELECTOR, "#conversation-list li.active button.delete").click()
    browser.switch_to.alert.accept()
    titles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#conversation-list .open")]
    assert titles == ["First question: name a fruit."]
    assert shown_question() == "First question: name a fruit."
    browser.refresh()
    open_page(browser, server)
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#conversation-list .open")] == titles


def test_api_key_is_needed_until_set_in_settings(keyed_server: ServerProcess, browser: Chrome) -> None:
    browser.get(keyed_server.url + "/")
    banner = wait_for(browser, lambda d: d.find_element(By.ID, "banner") if d.find_element(
        By.ID, "banner").is_displayed() else None, 30, "no error was shown for the model list")
    assert "401" in banner.text and "API key" in banner.text
    send(browser, "Hello?")
    answer = wait_until_answered(browser, 1)
    error = answer.find_element(By.CSS_SELECTOR, ".error")
    assert error.is_displayed() and "401" in error.text, error.text

    change_settings(browser, api_key=API_KEY, max_tokens="8")
    wait_for(browser, lambda d: not d.find_element(By.ID, "banner").is_displayed(), 30, "the error stayed")
    assert browser.find_element(By.ID, "model-select").get_attribute("value")
    answer.find_element(By.CSS_SELECTOR, "button.regenerate").click()
    answer = wait_until_answered(browser, 1)
    assert not answer.find_element(By.CSS_SELECTOR, ".error").is_displayed()
    assert answer.find_element(By.CSS_SELECTOR, ".content").text.strip()
    assert browser.execute_script("return localStorage.getItem('wick.apiKey')") == API_KEY


def test_markdown_is_highlighted_and_never_live_html(server: UiServer, browser: Chrome) -> None:
    open_page(browser, server)
    source = ("# Title\n\n<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=1</script>\n\n"
              "[bad](javascript:window.pwned=1) [good](https://example.com)\n\n"
              "```python\ndef f(x):\n    return x + 1\n```\n")
    html = browser.execute_async_script("""
        const [source, done] = arguments;
        import('/ui/markdown.js').then((m) => {
          const box = document.createElement('div');
          document.body.append(box);
          m.renderMarkdown(box, source);
          done(box.innerHTML);
        });""", source)
    assert "<h1>Title</h1>" in html
    assert "<img" not in html and "<script" not in html and "javascript:" not in html
    assert "&lt;script&gt;" in html
    assert 'href="https://example.com"' in html and 'rel="noopener noreferrer nofollow"' in html
    assert 'class="hljs-keyword"' in html
    assert browser.execute_script("return window.pwned") is None


def viewport(driver: Chrome, width: int, height: int, mobile: bool, dark: bool = False) -> None:
    metrics = {"width": width, "height": height, "deviceScaleFactor": 2 if mobile else 1, "mobile": mobile}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [
        {"name": "prefers-color-scheme", "value": "dark" if dark else "light"},
        {"name": "prefers-reduced-motion", "value": "reduce"}]})


def test_screenshots_at_desktop_and_phone_width(server: UiServer, browser: Chrome, artifacts: Path) -> None:
    viewport(browser, 1280, 800, mobile=False)
    open_page(browser, server)
    change_settings(browser, max_tokens="40", temperature="0")
    send(browser, "Write a Python function that adds two numbers, in a code block.")
    wait_until_answered(browser, 1)
    assert browser.execute_script("return [innerWidth, innerHeight]") == [1280, 800]
    browser.save_screenshot(str(artifacts / "desktop-1280x800.png"))
    viewport(browser, 1280, 800, mobile=False, dark=True)
    browser.save_screenshot(str(artifacts / "desktop-1280x800-dark.png"))

    viewport(browser, 390, 844, mobile=True)
    sidebar = browser.find_element(By.ID, "sidebar")
    wait_for(browser, lambda d: not sidebar.is_displayed(), 5, "the sidebar did not collapse at phone width")
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 390
    browser.save_screenshot(str(artifacts / "phone-390x844.png"))
    browser.find_element(By.ID, "toggle-sidebar").click()
    wait_for(browser, lambda d: sidebar.is_displayed() and sidebar.rect["x"] == 0, 5,
             "the sidebar did not open at phone width")
    browser.save_screenshot(str(artifacts / "phone-390x844-sidebar.png"))
    browser.find_element(By.ID, "close-sidebar").click()
    wait_for(browser, lambda d: not sidebar.is_displayed(), 5, "the sidebar did not close at phone width")
    viewport(browser, 390, 844, mobile=True, dark=True)
    browser.save_screenshot(str(artifacts / "phone-390x844-dark.png"))


# A stream with reasoning and a tool call, in the shapes vLLM sends, served to the page by a stand-in fetch.
FAKE_STREAM = """
  const chunks = [
    {choices: [{index: 0, delta: {role: 'assistant', content: ''}}]},
    {choices: [{index: 0, delta: {reasoning_content: 'The user wants '}}]},
    {choices: [{index: 0, delta: {reasoning_content: 'the weather.'}}]},
    {choices: [{index: 0, delta: {tool_calls: [{index: 0, id: 'call_1', type: 'function',
                                                function: {name: 'get_weather', arguments: '{"city": '}}]}}]},
    {choices: [{index: 0, delta: {tool_calls: [{index: 0, function: {arguments: '"Paris"}'}}]}}]},
    {choices: [{index: 0, delta: {content: 'Checking <b>now</b>.'}}]},
    {choices: [{index: 0, delta: {}, finish_reason: 'tool_calls'}]},
    {choices: [], usage: {prompt_tokens: 5, completion_tokens: 12, total_tokens: 17}},
  ];
  const realFetch = window.fetch;
  window.fetch = (url, init) => {
    if (!String(url).endsWith('/v1/chat/completions')) return realFetch(url, init);
    window.fetch = realFetch;
    const text = chunks.map((c) => `data: ${JSON.stringify(c)}\\n\\n`).join('') + 'data: [DONE]\\n\\n';
    return Promise.resolve(new Response(text, {headers: {'Content-Type': 'text/event-stream'}}));
  };"""


def test_reasoning_and_tool_calls_are_shown(server: UiServer, browser: Chrome) -> None:
    open_page(browser, server)
    browser.execute_script(FAKE_STREAM)
    send(browser, "What is the weather in Paris?")
    answer = wait_until_answered(browser, 1)
    reasoning = answer.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert reasoning.get_attribute("open") is None, "the reasoning is not folded"
    assert reasoning.find_element(By.TAG_NAME, "summary").text == "Reasoning"
    reasoning.find_element(By.TAG_NAME, "summary").click()
    assert reasoning.find_element(By.CSS_SELECTOR, "div").text == "The user wants the weather."
    call = answer.find_element(By.CSS_SELECTOR, "details.tool-call")
    assert call.find_element(By.TAG_NAME, "summary").text == "Tool call: get_weather"
    assert call.find_element(By.TAG_NAME, "pre").text == '{\n  "city": "Paris"\n}'
    content = answer.find_element(By.CSS_SELECTOR, ".content")
    assert content.text == "Checking <b>now</b>."
    assert not content.find_elements(By.TAG_NAME, "b")
    assert "12 tokens" in answer.find_element(By.CSS_SELECTOR, ".stats").text


def test_a_network_failure_is_shown_and_the_page_stays_usable(server: UiServer, browser: Chrome) -> None:
    open_page(browser, server)
    change_settings(browser, max_tokens="8")
    browser.execute_script("""
        const realFetch = window.fetch;
        window.fetch = () => { window.fetch = realFetch; return Promise.reject(new TypeError('Failed to fetch')); };""")
    send(browser, "Hello?")
    error = wait_until_answered(browser, 1).find_element(By.CSS_SELECTOR, ".error")
    assert "Could not reach the server" in error.text
    send(browser, "Hello again.")
    answer = wait_until_answered(browser, 2)
    assert answer.find_element(By.CSS_SELECTOR, ".content").text.strip()
    assert not answer.find_element(By.CSS_SELECTOR, ".error").is_displayed()


def test_the_model_menu_shows_the_whole_name(server: UiServer, browser: Chrome) -> None:
    """"SmolLM2-135M-Instruct.Q4_1": the ".Q4_1" was cut at desktop width."""
    open_page(browser, server)
    select = browser.find_element(By.ID, "model-select")
    needed = browser.execute_script(
        "const s = arguments[0], style = getComputedStyle(s), c = document.createElement('canvas').getContext('2d');"
        "c.font = style.font; return c.measureText(s.value).width + parseFloat(style.paddingLeft)"
        " + parseFloat(style.paddingRight);", select)
    assert select.get_attribute("value").endswith(".Q4_1")
    assert select.size["width"] >= needed + 16, (select.size, needed)  # and the menu's arrow


def test_every_control_is_labelled(server: UiServer, browser: Chrome) -> None:
    open_page(browser, server)
    unlabelled = browser.execute_script("""
        return [...document.querySelectorAll('button, input, select, textarea')].filter((e) => {
          const byFor = e.id && document.querySelector(`label[for="${e.id}"]`);
          return !(byFor || e.getAttribute('aria-label') || e.textContent.trim());
        }).map((e) => e.outerHTML);""")
    assert unlabelled == []

"""The page in a real browser: headless Chromium (the system's, through its chromedriver; nothing is
downloaded) against a live `charlm serve` on 127.0.0.1. Writes, reads and looks inside, and saves a
screenshot of each view (to $CHARLM_SCREENSHOTS when set, e.g. docs/; else to the test's tmp_path)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the page needs the serve extra (pip install 'charlm[serve]')")
webdriver = pytest.importorskip(
    "selenium.webdriver",
    reason="no selenium: pip install selenium (and apt-get install chromium chromium-driver) to run the browser test",
)

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,  # about 30 s on 2 cores: a server process, a browser, three views
    pytest.mark.skipif(
        not (BROWSER and DRIVER),
        reason="no Chromium and chromedriver installed "
        "(apt-get install chromium chromium-driver): the browser test is skipped",
    ),
]

PARAGRAPH = "The model reads this paragraph.\nEach character is coloured by the bits it cost."


@pytest.fixture(scope="module")
def server(trained_run):
    """A live `charlm serve` on a free port of 127.0.0.1: its address."""
    process = subprocess.Popen(
        [sys.executable, "-m", "charlm", "--threads", "1", "serve", str(trained_run), "--port", "0", "--device", "cpu"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = None
        for line in process.stderr:
            found = re.search(r"on (http://127\.0\.0\.1:\d+/)", line)
            if found:
                address = found.group(1)
                break
        assert address, "charlm serve did not say where it listens"
        yield address
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=900,640",
        "--disable-gpu",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait_for(condition, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("the page did not get there in time")


def shoot(driver, name: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("CHARLM_SCREENSHOTS") or tmp_path)
    path = folder / f"serve-{name}.png"
    driver.save_screenshot(str(path))
    return path


def test_the_page_writes_reads_and_looks_inside(server, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    find = lambda css: browser.find_element(By.CSS_SELECTOR, css)  # noqa: E731
    browser.get(server)
    wait_for(lambda: "lru" in find("#about").text)

    find("#prompt").send_keys("The ")  # Write: the text streams in after the prompt
    find("#length").clear()
    find("#length").send_keys("400")
    find("#seed").send_keys("7")
    find("#generate").click()
    wait_for(lambda: len(find("#written").text) > 40)
    wait_for(lambda: "symbols" in find("#write-status").text)
    assert find("#written").text.startswith("The ") and find("#write-status").text == "400 symbols, seed 7"
    assert shoot(browser, "write", tmp_path).stat().st_size > 1000

    find('nav button[data-view="read"]').click()  # Read: coloured characters with a tooltip
    find("#read-text").send_keys(PARAGRAPH)
    find("#score").click()
    wait_for(lambda: "bits per character" in find("#read-status").text)
    spans = browser.find_elements(By.CSS_SELECTOR, "#scored span.c")
    assert len(spans) == len(PARAGRAPH)
    colours = {span.value_of_css_property("background-color") for span in spans[1:]}
    assert len(colours) > 5  # the characters are not all one colour
    ActionChains(browser).move_to_element(spans[5]).perform()
    tip = wait_for(lambda: find("#tip").is_displayed() and find("#tip"))
    assert "bits" in tip.text and "%" in tip.text
    assert shoot(browser, "read", tmp_path).stat().st_size > 1000

    find('nav button[data-view="inside"]').click()  # Look inside: one unit, then another
    find("#inside-text").send_keys(PARAGRAPH)
    find("#look").click()
    buttons = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#units button"))
    first = [
        s.value_of_css_property("background-color") for s in browser.find_elements(By.CSS_SELECTOR, "#activated span.c")
    ]
    buttons[1].click()
    wait_for(lambda: buttons[1].get_attribute("class") == "on")
    second = [
        s.value_of_css_property("background-color") for s in browser.find_elements(By.CSS_SELECTOR, "#activated span.c")
    ]
    assert len(first) == len(second) == len(PARAGRAPH) and first != second
    assert find("#inside-status").text.startswith("layer 0, unit ")
    assert shoot(browser, "inside", tmp_path).stat().st_size > 1000


def test_the_api_documentation_renders_without_the_internet(server, browser):
    """FastAPI's /docs (Swagger UI) from the scripts charlm's server ships; this machine has no CDN."""
    from selenium.webdriver.common.by import By

    browser.get(server + "docs")
    paths = wait_for(lambda: [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")], 20)
    assert {"/v1/models", "/v1/sample", "/v1/score", "/v1/activations"} <= set(paths)


def test_the_page_fits_a_phone_screen(server, browser, tmp_path):
    """At a phone's width (390 CSS pixels) nothing runs off the side and every view's controls show."""
    from selenium.webdriver.common.by import By

    browser.set_window_size(390, 844)
    try:
        browser.get(server)
        wait_for(lambda: "lru" in browser.find_element(By.CSS_SELECTOR, "#about").text)
        for view in ("write", "read", "inside"):
            browser.find_element(By.CSS_SELECTOR, f'nav button[data-view="{view}"]').click()
            width = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1], f"the {view} view is {width[0]} px wide on a {width[1]} px screen"
            buttons = [b for b in browser.find_elements(By.CSS_SELECTOR, "main button") if b.is_displayed()]
            assert buttons and all(b.rect["x"] + b.rect["width"] <= width[1] for b in buttons)
        assert shoot(browser, "phone", tmp_path).stat().st_size > 1000
    finally:
        browser.set_window_size(900, 640)

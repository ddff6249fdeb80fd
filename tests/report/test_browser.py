"""The report in a real browser (headless chromium): every preview loads, videos play, filters filter, and the
page logs no error. A screenshot of each page it opens is kept in the test's tmp folder."""

from __future__ import annotations

import pytest

from tests.report.browser import ensure_browser, start_browser

WAIT_S = 15.0


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    reason = ensure_browser()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("selenium", reason="selenium is in the test extra: pip install -e '.[test]'")
    driver = start_browser(str(tmp_path_factory.mktemp("chromium-profile")))
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


def _open(browser, path):
    browser.get(path.as_uri())
    browser.get_log("browser")  # what an earlier page logged is not this page's


def _wait(browser, script: str, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(browser, WAIT_S, poll_frequency=0.05).until(lambda driver: driver.execute_script(script))
    except Exception as error:  # noqa: BLE001 - say what never happened
        raise AssertionError(f"{what} within {WAIT_S} s") from error


def _errors(browser) -> list[dict]:
    return [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "ERROR")]


def _cards(browser) -> list[tuple[str, str]]:
    return browser.execute_script(
        "return [...document.querySelectorAll('article.job')].map(a => [a.dataset.status, a.dataset.model])")


def test_every_preview_loads_and_every_video_has_metadata(report_run, browser, tmp_path):
    _open(browser, report_run.report / "index.html")
    _wait(browser, "return [...document.images].every(i => i.complete)", "every image finished loading")
    images = browser.execute_script("return [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth])")
    assert images and all(width > 0 for _, width in images), images
    videos = _wait(browser, "const v = [...document.querySelectorAll('video')];"
                   "return v.length && v.every(e => e.readyState >= 1) && v.map(e => [e.videoWidth, e.readyState])",
                   "every video had its metadata")
    assert videos == [[64, videos[0][1]]] and videos[0][1] >= 1
    posters = browser.execute_async_script(  # a video's poster is an image too: it must decode
        "const done = arguments[arguments.length - 1];"
        "Promise.all([...document.querySelectorAll('video')].map(v => new Promise(ok => {"
        "  const i = new Image(); i.onload = () => ok(i.naturalWidth); i.onerror = () => ok(0); i.src = v.poster;"
        "}))).then(done);")
    assert posters == [64]
    assert {status for status, _ in _cards(browser)} == {"done", "failed", "rejected"}
    assert _errors(browser) == []
    assert browser.save_screenshot(str(tmp_path / "index.png")) and (tmp_path / "index.png").stat().st_size > 10_000


@pytest.mark.parametrize("status, count", [("done", 2), ("failed", 1), ("rejected", 1)])
def test_the_status_filter_shows_only_those_rows(report_run, browser, tmp_path, status, count):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(browser, report_run.report / "index.html")
    Select(browser.find_element(By.NAME, "status")).select_by_value(status)
    _wait(browser, f"return location.pathname.endsWith('/{status}-all-1.html') && document.readyState === 'complete'",
          f"the {status} page opened")
    cards = _cards(browser)
    assert len(cards) == count and {card_status for card_status, _ in cards} == {status}
    assert Select(browser.find_element(By.NAME, "status")).first_selected_option.get_attribute("value") == status
    assert _errors(browser) == []
    browser.save_screenshot(str(tmp_path / f"{status}.png"))


def test_the_model_filter_keeps_the_status(report_run, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(browser, report_run.report / "failed-all-1.html")
    Select(browser.find_element(By.NAME, "model")).select_by_visible_text("tiny-wan")
    _wait(browser, "return location.pathname.endsWith('/failed-m2-1.html')", "the failed tiny-wan page opened")
    assert _cards(browser) == [["failed", "tiny-wan"]]
    Select(browser.find_element(By.NAME, "status")).select_by_value("all")
    _wait(browser, "return location.pathname.endsWith('/all-m2-1.html')", "the tiny-wan page opened")
    assert sorted(_cards(browser)) == [["done", "tiny-wan"], ["failed", "tiny-wan"]]
    assert _errors(browser) == []


@pytest.fixture(scope="module")
def sound_run(tmp_path_factory):
    """`gen run --report` of two LTX-2 rows: one with its sound, one that asks for none (`audio: false`)."""
    from tests.support.runs import run_cli, write_manifest

    root = tmp_path_factory.mktemp("sound-run")
    rows = [{"id": "surf", "prompt": "waves on a beach", "model": "tiny-ltx2", "num_inference_steps": 2},
            {"id": "mime", "prompt": "a mime in the street", "model": "tiny-ltx2", "num_inference_steps": 2,
             "audio": False}]
    out = root / "out"
    result = run_cli("run", write_manifest(str(root / "manifest.parquet"), rows), "--out", str(out), "-q", "--report")
    assert result.returncode == 0, result.stderr
    return out


def test_a_video_with_sound_plays_its_audio_track_and_a_silent_row_has_none(sound_run, browser):
    import pyarrow.parquet as pq

    from genbatch.io.sound import streams

    results = {row["id"]: row for row in pq.read_table(sound_run / "results").to_pylist()}
    assert (results["surf"]["audio"], results["surf"]["audio_sample_rate"]) == (True, 16000)
    assert (results["mime"]["audio"], results["mime"]["audio_sample_rate"]) == (False, None)
    assert streams((sound_run / "outputs" / "surf.mp4").read_bytes()) == ["video", "audio"]
    assert streams((sound_run / "outputs" / "mime.mp4").read_bytes()) == ["video"]
    _open(browser, sound_run / "report" / "index.html")
    cards = browser.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('article.job')].map(a => "
        "[a.querySelector('video').getAttribute('src'), a.textContent.includes('Hz')]))")
    assert sorted(cards.values()) == [False, True]  # one card says it has sound
    decoded = browser.execute_async_script(  # play each preview to its end: the audio bytes chromium decoded
        "const done = arguments[arguments.length - 1];"
        "Promise.all([...document.querySelectorAll('video')].map(v => new Promise(ok => {"
        "  v.muted = false; v.loop = false; v.onended = () => ok([v.getAttribute('src'), v.webkitAudioDecodedByteCount]);"
        "  v.play().catch(e => ok([v.getAttribute('src'), String(e)]));"
        "}))).then(done);")
    by_sound = {cards[src]: count for src, count in decoded}
    assert by_sound[True] > 0 and by_sound[False] == 0, decoded
    assert _errors(browser) == []

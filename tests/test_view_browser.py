"""deliberation_env.view in a real browser: headless Chromium (Debian's ``chromium``, driven by ``playwright``) loads
the index and problem pages of a small recorded set, served on 127.0.0.1, with no console errors; the pages show the
recorded texts and the joint-action grid, the filters work, and markup in a completion renders as text."""

from __future__ import annotations

import shutil

import pytest

from deliberation_env.view.site import build_set_site, build_trace_site, serving
from deliberation_env.view.tree import record_texts, walk_split
from tests.test_view import INJECTED, play_traces, record_markup_set

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    return record_markup_set(tmp_path_factory)


@pytest.fixture(scope="module")
def browser():
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("Chromium is not installed: apt-get install chromium (bash scripts/setup-tests.sh does, as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")
    with sync_api.sync_playwright() as playwright:
        # Debian's Chromium, never a browser that playwright would download
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser):
    """A fresh page whose console errors and uncaught exceptions are collected in ``page.errors``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.errors = []
    page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    context.close()


def test_the_index_and_a_problem_page_show_the_recording_without_errors(small_set, open_page, tmp_path):
    page = open_page
    site = build_set_site(small_set, tmp_path / "site").out
    trees = walk_split(small_set, "test") + walk_split(small_set, "train")
    texts = record_texts(small_set)
    with serving(site) as url:
        page.goto(url + "index.html")
        assert page.inner_text("#count") == "8 of 8 problems shown"
        page.select_option("select[data-key=vote]", "1")
        assert page.inner_text("#count") == f"{sum(t.vote_correct for t in trees)} of 8 problems shown"
        page.select_option("select[data-key=split]", "train")
        shown = page.locator("table.problems tbody tr:visible")
        assert shown.count() == sum(t.vote_correct for t in trees if t.split == "train")
        page.select_option("select[data-key=vote]", "")
        page.select_option("select[data-key=split]", "")
        page.click("text=test #0")
        page.wait_for_url("**/problems/test-00000.html")
        tree = trees[0]
        assert page.inner_text("#question") == tree.question and page.inner_text("#gold") == tree.gold
        solutions = page.locator(".agent details.text pre")
        assert [solutions.nth(i).text_content() for i in range(3)] == [v.text for v in tree.round0]
        refined = page.locator("table.moves details.text pre")
        assert [refined.nth(i).text_content() for i in range(3)] == \
            [texts["test", tree.id, 0, 1, i, "refine"][0] for i in range(3)]
        assert page.locator("#grid td.cell").count() == 27
        assert page.locator("#grid td.cell.right").count() == tree.right_cells
        assert page.locator("#grid td.cell:has(span.tag:text-is('SC'))").get_attribute("data-joint") == "0-0-0"
        assert page.locator("#grid td.cell:has(span.tag:text-is('DB'))").get_attribute("data-joint") == "1-1-1"
        page.screenshot(path=str(tmp_path / "problem.png"), full_page=True)
        # agent 0's completion opened with a script and an <img onerror>: shown as text, neither ran
        assert page.locator(".agent[data-agent='0'] details.text pre").text_content().startswith(INJECTED)
        assert page.title() != "pwned" and page.evaluate("document.body.dataset.pwned") is None
        assert page.evaluate("document.querySelectorAll('body script, body img').length") == 0
    assert page.errors == []
    assert (tmp_path / "problem.png").stat().st_size > 10_000


def test_pages_open_from_disk_and_traced_policies_show_side_by_side(small_set, open_page, tmp_path):
    page = open_page
    trace = play_traces(small_set, tmp_path / "traces.jsonl")
    site = build_set_site(small_set, tmp_path / "site", splits=["test"], traces=[trace]).out
    page.goto((site / "problems" / "test-00001.html").resolve().as_uri())
    threshold = page.locator("#grid td.cell:has(span.tag:text-is('TH'))").get_attribute("data-joint")
    assert page.locator("#grid td.cell:has(span.tag:text-is('P1'))").get_attribute("data-joint") == threshold
    assert page.locator(".side .policy h3").all_inner_texts() == ["threshold", "random"]
    traces = build_trace_site([trace], tmp_path / "traces").out
    page.goto((traces / "index.html").resolve().as_uri())
    assert page.inner_text("#count") == "5 of 5 problems shown"
    page.select_option("select[data-key=differ]", "1")
    differ = page.locator("table.problems tbody tr:visible").count()
    page.select_option("select[data-key=differ]", "0")
    assert differ + page.locator("table.problems tbody tr:visible").count() == 5
    page.goto((traces / "problems" / "trace-00000.html").resolve().as_uri())
    assert page.locator(".side .policy").count() == 2 and page.locator(".episode").count() == 4
    page.screenshot(path=str(tmp_path / "trace.png"), full_page=True)
    assert page.errors == []

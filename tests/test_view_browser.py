"""deliberation_env.view in a real browser: headless Chromium (Debian's ``chromium``, driven by ``playwright``) loads
the index and problem pages of a small recorded set, served on 127.0.0.1, with no console errors; the pages show the
recorded texts and the joint-action grid, the filters work, and markup in a completion renders as text. Then what a
user found: filters lost on Back, a bidi override reversing text, a long answer widening the page; and what a
researcher asked for: sorting, grouping, the URL keeping them, previous/next following them, each call's prompt."""

from __future__ import annotations

import json
import shutil

import pytest

from deliberation_env.view.episodes import load_policies
from deliberation_env.view.markup import show_controls
from deliberation_env.view.site import build_set_site, build_trace_site, serving
from deliberation_env.view.tree import walk_split
from tests.test_view import INJECTED, LONG, REVERSED, play_traces, record_markup_set, record_texts

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


@pytest.fixture(scope="module")
def site(small_set, tmp_path_factory):
    """The set's site: both splits, in the set's order (test 0-4, train 0-2)."""
    return build_set_site(small_set, tmp_path_factory.mktemp("site") / "site").out


@pytest.fixture(scope="module")
def trees(small_set):
    return walk_split(small_set, "test") + walk_split(small_set, "train")


def new_page(browser, width=1400):
    """A fresh page whose console errors and uncaught exceptions are collected in ``page.errors``."""
    context = browser.new_context(viewport={"width": width, "height": 1000})
    page = context.new_page()
    page.errors = []
    page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    return page


@pytest.fixture
def open_page(browser):
    page = new_page(browser)
    yield page
    page.context.close()


def shown_rows(page) -> list[str]:
    """The problems the index shows, in its order (their links' text)."""
    return page.locator("table.problems tbody tr:visible a").all_inner_texts()


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
        assert [solutions.nth(i).text_content() for i in range(3)] == [show_controls(v.text) for v in tree.round0]
        refined = page.locator("table.moves details.text pre")
        assert [refined.nth(i).text_content() for i in range(3)] == \
            [texts["test", tree.id, 0, 1, i, "refine"][0]["text"] for i in range(3)]
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
    trace = play_traces(small_set, tmp_path / "traces.jsonl", labels=("threshold", "random", "uniform"))
    site = build_set_site(small_set, tmp_path / "site", splits=["test"], traces=[trace]).out
    page.goto((site / "problems" / "test-00001.html").resolve().as_uri())
    threshold = page.locator("#grid td.cell:has(span.tag:text-is('TH'))").get_attribute("data-joint")
    assert page.locator("#grid td.cell:has(span.tag:text-is('P1'))").get_attribute("data-joint") == threshold
    assert page.locator(".side .policy h3").all_inner_texts() == ["threshold", "random", "uniform"]
    # where a policy's first-round choice differs from a protocol's
    random, trees = load_policies([trace], ["random"])[0], walk_split(small_set, "test")
    page.goto((site / "index.html").resolve().as_uri())
    for key, value, expected in (("plays0", "=TH", 5), ("plays0", "!TH", 0), ("plays1", "!DB", sum(
            any(joint != tree.protocols["debate"] for joint in random.joints(("test", tree.id))) for tree in trees))):
        page.select_option(f"select[data-key={key}]", value)
        assert page.inner_text("#count") == f"{expected} of 5 problems shown"
        page.select_option(f"select[data-key={key}]", "")
    traces = build_trace_site([trace], tmp_path / "traces").out
    page.goto((traces / "index.html").resolve().as_uri())
    assert page.inner_text("#count") == "5 of 5 problems shown"
    page.select_option("select[data-key=differ]", "1")
    differ = page.locator("table.problems tbody tr:visible").count()
    page.select_option("select[data-key=differ]", "0")
    assert differ + page.locator("table.problems tbody tr:visible").count() == 5
    page.goto((traces / "problems" / "trace-00000.html").resolve().as_uri())
    assert page.locator(".side .policy").count() == 3 and page.locator(".episode").count() == 6
    # the question and gold answer (the trace's task rebuilt), and the probabilities the uniform policy exposed
    assert page.inner_text("#question") == trees[0].question and page.inner_text("#gold") == trees[0].gold
    probabilities = page.locator(".policy[data-label=uniform] .prob")
    assert probabilities.count() == 6 and all(text.startswith("P 0.") for text in probabilities.all_inner_texts())
    assert page.locator(".policy[data-label=threshold] .prob").count() == 0
    page.screenshot(path=str(tmp_path / "trace.png"), full_page=True)
    assert page.errors == []


def test_the_filters_live_in_the_url_so_back_and_reload_keep_them(site, trees, open_page):
    page = open_page
    right = [f"{t.split} #{t.index}" for t in trees if t.vote_correct]
    with serving(site) as url:
        page.goto(url + "index.html")
        page.select_option("select[data-key=vote]", "1")
        assert page.url == url + "index.html?vote=1" and shown_rows(page) == right
        page.locator("table.problems tbody tr:visible a").first.click()
        page.wait_for_url("**/problems/*.html?vote=1")
        page.go_back()  # the bug: the select still said "right", but every row showed
        page.wait_for_url("**/index.html?vote=1")
        assert page.input_value("select[data-key=vote]") == "1" and shown_rows(page) == right
        assert page.inner_text("#count") == f"{len(right)} of 8 problems shown"
        page.reload()
        assert page.input_value("select[data-key=vote]") == "1" and shown_rows(page) == right
        page.goto(url + "index.html?split=train&vote=0&q=%23")  # a link with filters and a search opens with them
        assert page.input_value("select[data-key=split]") == "train" and page.input_value("#search") == "#"
        assert shown_rows(page) == [f"train #{t.index}" for t in trees if t.split == "train" and not t.vote_correct]
    assert page.errors == []


def char_lefts(page, selector: str, text: str) -> list[float]:
    """Where each character of ``text`` is drawn (x of its left edge), inside the first element of ``selector``."""
    return page.evaluate("""([selector, text]) => {
        const walker = document.createTreeWalker(document.querySelector(selector), NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const at = node.data.indexOf(text);
            if (at < 0) continue;
            return Array.from(text, (_, i) => {
                const range = document.createRange();
                range.setStart(node, at + i);
                range.setEnd(node, at + i + 1);
                return range.getBoundingClientRect().left;
            });
        }
        return null;
    }""", [selector, text])


def test_a_bidi_override_in_model_text_reverses_nothing(small_set, open_page, tmp_path):
    page = open_page
    trace = play_traces(small_set, tmp_path / "traces.jsonl", labels=("threshold",))
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    for line in lines:  # a trace label is text from outside too: it lands in the filter bar
        line["label"] = "threshold " + REVERSED
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    site = build_set_site(small_set, tmp_path / "site", splits=["test"], traces=[trace]).out
    page.goto((site / "problems" / "test-00000.html").resolve().as_uri())
    solution, verdict = ".agent[data-agent='1'] details.text pre", ".agent[data-agent='1'] q.verdict"
    assert page.text_content(solution).startswith("[U+202E]ABC DEF")  # the control is written out
    for selector, text in ((solution, "ABC DEF"), (verdict, "GHI JKL")):
        lefts = char_lefts(page, selector, text)
        assert lefts == sorted(lefts), f"{selector}: {text!r} drawn out of order"
    page.goto((site / "index.html").resolve().as_uri())
    label = "#filters label:has(select[data-key=policy0])"
    assert page.inner_text(label).startswith("P1 threshold [U+202E]ABC DEF")
    lefts = char_lefts(page, label, "ABC DEF")
    assert lefts == sorted(lefts)
    boxes = [page.locator("#filters label").nth(i).bounding_box() for i in range(page.locator("#filters label").count())]
    assert all(c["x"] > b["x"] or c["y"] >= b["y"] + b["height"] - 1  # the bar reads left to right, line by line
               for b, c in zip(boxes, boxes[1:]))
    assert page.errors == []


def test_a_long_answer_and_a_wide_table_stay_inside_a_narrow_window(small_set, site, browser, tmp_path):
    trace = play_traces(small_set, tmp_path / "traces.jsonl")
    traces = build_trace_site([trace], tmp_path / "traces").out
    for width in (1000, 640):
        page = new_page(browser, width)
        for folder, name in ((site, "index.html"), (site, "problems/test-00001.html"), (traces, "index.html"),
                             (traces, "problems/trace-00001.html")):
            page.goto((folder / name).resolve().as_uri())
            assert page.evaluate("document.documentElement.scrollWidth") <= width, f"{name} at {width} px"
        page.goto((site / "problems" / "test-00001.html").resolve().as_uri())
        assert page.inner_text("#grid td.cell[data-joint='0-0-0'] .consensus").replace("\n", "") == LONG
        page.goto((site / "index.html").resolve().as_uri())
        box = page.locator(".scroll:has(table.problems)")
        assert box.evaluate("e => e.clientWidth") <= width
        if width == 640:  # the table is wider than the window: it scrolls in its own box
            assert box.evaluate("e => e.scrollWidth > e.clientWidth")
        assert page.errors == []
        page.context.close()


def test_sorting_grouping_and_a_problem_s_previous_next_follow_the_url(site, trees, open_page):
    page = open_page
    with serving(site) as url:
        page.goto(url + "index.html")
        page.click("button.sort[data-sort=right]")
        expected = sorted(trees, key=lambda t: t.right_cells)  # a stable sort: ties keep the set's order
        assert shown_rows(page) == [f"{t.split} #{t.index}" for t in expected] and page.url.endswith("?sort=right")
        page.click("button.sort[data-sort=right]")
        assert page.url.endswith("?sort=right&desc=1") and page.is_checked("#desc")
        page.select_option("select[data-key=split]", "test")
        page.select_option("#group", "vote")
        test = [t for t in trees if t.split == "test"]
        expected = sorted(test, key=lambda t: (t.vote_correct, -t.right_cells))
        names = [f"test #{t.index}" for t in expected]
        assert shown_rows(page) == names
        headings = page.locator("tr.group").all_inner_texts()
        assert [h.split(" · ")[:2] for h in headings] == [
            [f"vote: {word}", f"{sum(t.vote_correct == value for t in test)} shown"]
            for value, word in ((False, "wrong"), (True, "right")) if any(t.vote_correct == value for t in test)]
        query = "?split=test&sort=right&desc=1&group=vote"
        assert page.url == url + "index.html" + query
        page.click(f"text={names[0]}")
        visited = []
        while True:  # next -> next -> ...: the index's rows, in its order
            page.wait_for_url(f"**{query}")
            visited.append(page.inner_text("h1").split(": ")[1])
            assert page.inner_text("#position") == f"{len(visited)} of the {len(names)} problems the index shows"
            following = page.locator("nav a[rel=next]")
            if not following.is_visible():
                break
            following.click()
        assert visited == names
        page.click("nav a[rel=prev]")
        page.wait_for_url(f"**{query}")
        assert page.inner_text("h1").endswith(names[-2])
        page.click("nav a.up")
        page.wait_for_url(url + "index.html" + query)
        assert shown_rows(page) == names
        # a page the filters leave out links to the nearest problems they keep, in the index's order
        wrong, right = [t for t in test if not t.vote_correct], [t for t in test if t.vote_correct]
        later = [t for t in right if t.index > wrong[0].index]
        assert wrong and later  # the sim's set: test #1 wrong, #2-4 right
        page.goto(url + f"problems/test-{wrong[0].index:05d}.html?split=test&vote=1")
        assert page.inner_text("#position") == f"not among the {len(right)} problems the index shows"
        assert page.get_attribute("nav a[rel=next]", "href") == \
            f"../problems/test-{later[0].index:05d}.html?split=test&vote=1"
    assert page.errors == []


def test_each_call_shows_its_prompt_and_tokens(small_set, site, trees, open_page):
    page = open_page
    texts = record_texts(small_set)
    tree = trees[0]
    page.goto((site / "problems" / "test-00000.html").resolve().as_uri())
    for i in range(3):
        calls = page.locator(f".agent[data-agent='{i}'] details.call")
        records = [texts["test", tree.id, 0, 0, i, kind][0] for kind in ("solve", "critic")]
        assert [calls.nth(k).get_attribute("data-kind") for k in range(2)] == ["solve", "critic"]
        assert [calls.nth(k).locator(".tokens").inner_text() for k in range(2)] == [
            f"{r['prompt_tokens']} + {r['completion_tokens']}" for r in records]
        calls.nth(1).locator("summary").click()  # the critic's prompt: the solution it judged
        shown = calls.nth(1).locator(".messages pre").last
        assert shown.is_visible() and show_controls(tree.round0[i].text.strip()) in shown.text_content()
        refine = page.locator("table.moves tbody tr").nth(i).locator("details.call[data-kind=refine]")
        record = texts["test", tree.id, 0, 1, i, "refine"][0]
        assert refine.locator(".tokens").inner_text() == f"{record['prompt_tokens']} + {record['completion_tokens']}"
        refine.locator("summary").click()  # what REFINE was shown: the question and each peer's answer
        prompt = refine.locator(".messages pre").last.inner_text()
        assert tree.question in prompt and all(f"answered {show_controls(tree.round0[j].answer or '(no answer)')}"
                                               in prompt for j in range(3) if j != i)
    assert page.errors == []

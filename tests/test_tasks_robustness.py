"""Arbitrary text never crashes or stalls an extractor or a grader (property tests).

Each call must return (a string or None; a bool) within one second of CPU time, including
inputs of 50,000 characters built to trigger regex backtracking or deep brace nesting. CPU
time, not wall-clock time, so that a busy shared machine cannot fail the test; catastrophic
backtracking or a runaway sympy computation burns CPU and is caught either way.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deliberation_env import TASKS
from deliberation_env.tasks.extract import last_boxed
from deliberation_env.tasks.latex import call_with_time_limit, latex_equal, normalize_latex
from deliberation_env.tasks.numeric import extract_number, normalize_number

NAMES = ("gsm8k", "math", "aime24", "amc23", "mmlu")
LIMIT = 1.0
SETTINGS = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))

ALPHABET = "0123456789{},.-+/$%\\ \n()[]^_=*#:ABCDboxedfrac answer is The Answer"
UNITS = st.sampled_from([
    "1", "1,", "{", "}", "\\boxed{", "\\boxed", "answer is ", "Answer: ", "#### ", "$", "(", "\\frac{",
    " ", "\\text{ ", "^{", "9^", "1.", "-", "(B)", "**", "\\left(", "answer is (", "x=", "!",
])
LONG = st.builds(lambda unit, count: (unit * count)[:50_000], st.text(ALPHABET, min_size=1, max_size=12) | UNITS,
                 st.integers(1, 50_000))
TEXT = st.text(max_size=2_000) | st.text(ALPHABET, max_size=2_000) | LONG
ADVERSARIAL = [
    "1" * 50_000, "1," * 25_000, "{" * 50_000, "}" * 50_000, "\\boxed{" * 7_000, "\\boxed " * 7_000,
    "answer is " * 5_000, " " * 50_000, "$" * 50_000, "9^" * 25_000 + "9", "(" * 50_000, "#### " * 10_000,
    "\\text{ " * 7_000, "1" * 4_999 + "." + "1" * 45_000, "-" * 50_000, "\\frac{1}{" * 5_000, "A)" * 25_000,
    "\\boxed{" + "{" * 20_000 + "}" * 20_000 + "}", "Answer: " + "(" * 40_000, "x=" * 25_000,
    "\\(" * 12_500 + "\\)" * 12_500, " $ " * 15_000, "." * 50_000, "The answer is $" + "\\frac{" * 7_000,
]


@cache
def _task_and_problem(name: str, data_dir: str):
    task = TASKS.make(name, data_dir=data_dir)
    return task, task.problems("test")[0]


def _timed(func, *args):
    started = time.process_time()
    result = func(*args)
    elapsed = time.process_time() - started
    assert elapsed < LIMIT, f"{func.__qualname__} took {elapsed:.2f} s on {len(args[-1])} chars"
    return result


def _check(task, problem, text: str) -> None:
    answer = _timed(task.extract_answer, text)
    assert answer is None or (isinstance(answer, str) and answer)
    assert _timed(task.grade, problem, answer) in (True, False)
    assert _timed(task.grade, problem, text) in (True, False)


@pytest.fixture(scope="module", autouse=True)
def _warm_up():
    latex_equal("x+1", "1+x")  # import math-verify and build its parsers outside the timed calls


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(text=TEXT)
def test_extract_and_grade_any_text(name, text, data_dir):
    task, problem = _task_and_problem(name, str(data_dir))
    _check(task, problem, text)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_inputs_are_fast(name, text, data_dir):
    task, problem = _task_and_problem(name, str(data_dir))
    _check(task, problem, text)


@SETTINGS
@given(text=TEXT)
def test_helpers_never_raise(text):
    for func in (extract_number, normalize_number, last_boxed, normalize_latex):
        _timed(func, text)
    assert normalize_latex(normalize_latex(text)) == normalize_latex(text)


@SETTINGS
@given(left=st.text(ALPHABET, max_size=60), right=st.text(ALPHABET, max_size=60))
def test_latex_equal_is_bounded(left, right):
    assert _timed(latex_equal, left, right) in (True, False)


def test_pathological_sympy_input_times_out_as_unequal():
    started = time.process_time()
    assert latex_equal("9^{9^{9^{9^{9}}}}", "2") is False
    assert time.process_time() - started < LIMIT


def test_time_limit_restores_an_outer_timer():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        assert call_with_time_limit(lambda: 7, 0.1) == 7
        with pytest.raises(TimeoutError):
            call_with_time_limit(lambda: time.sleep(2), 0.05)
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 0.3  # the outer timer is running again
        time.sleep(0.4)
        assert fired == [True]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_latex_equal_in_a_worker_thread():
    """Signals only work in the main thread: there, risky inputs are refused instead of timed."""
    results: dict[str, bool] = {}

    def work():
        results["half"] = latex_equal("\\frac{2}{4}+0", "\\frac{1}{2}")
        started = time.process_time()
        results["tower"] = latex_equal("9^{9^{9^{9^{9}}}}", "2")
        results["fast"] = time.process_time() - started < LIMIT

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=30)
    assert results == {"half": True, "tower": False, "fast": True}


def test_time_limit_holds_when_its_first_signal_is_swallowed():
    # The garbage collector can run a weakref callback just as the timer fires; Python then prints the exception
    # and drops it. The limit must fire again rather than let the work run on.
    def swallows_the_first_signal():
        with contextlib.suppress(BaseException):
            time.sleep(1)
        time.sleep(3)

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        call_with_time_limit(swallows_the_first_signal, 0.05)
    assert time.monotonic() - started < 2
    assert signal.getitimer(signal.ITIMER_REAL)[1] == 0.0  # no repeating timer left behind


def test_a_signal_swallowed_by_a_finaliser_is_not_reported(monkeypatch):
    """A ``__del__`` running when the limit fires swallows the signal: Python hands it to ``sys.unraisablehook``
    (under pytest, a hook that formats its traceback, long enough for the next tick to cut it short and fail the
    test). That signal is expected, so the limit keeps it from the hook; the next tick still stops the work."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    class SlowFinaliser:
        def __del__(self):
            started = time.monotonic()
            while time.monotonic() - started < 0.3:
                pass

    def work():
        SlowFinaliser()  # dropped at once: its __del__ runs, and swallows the first signal
        time.sleep(3)

    with pytest.raises(TimeoutError):
        call_with_time_limit(work, 0.05)
    assert reported == []
    assert sys.unraisablehook == reported.append  # restored

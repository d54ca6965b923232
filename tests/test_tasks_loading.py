"""Loading the benchmark data: resolution order, clear errors, other MMLU layouts, prompts."""

from __future__ import annotations

import gzip
import json
import socket
import sys
import time
from pathlib import Path

import pytest

import deliberation_env
from deliberation_env import TASKS
from deliberation_env.tasks import hub
from deliberation_env.tasks.base import DATA_ENV_VAR, BaseTask
from deliberation_env.tasks.extract import DataFormatError, load_jsonl

HUB_IDS = {"gsm8k": "openai/gsm8k", "math": "HuggingFaceH4/MATH-500", "aime24": "HuggingFaceH4/aime_2024",
           "amc23": "math-ai/amc23", "mmlu": "cais/mmlu"}
FILES = {"gsm8k": "gsm8k/test.jsonl", "math": "math500/test.jsonl", "aime24": "aime24/test.jsonl",
         "amc23": "amc23/test.jsonl", "mmlu": "mmlu_stem/test.jsonl"}
GOOD_ROWS = {
    "gsm8k": {"question": "What is 2 + 3?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"},
    "math": {"problem": "What is 1/2 + 1/2?", "answer": "1", "solution": "$\\boxed{1}$", "level": 1},
    "aime24": {"id": 1, "problem": "Find 1 + 1.", "answer": "002"},
    "amc23": {"id": 1, "question": "Find 1 + 1.", "answer": 2.0},
    "mmlu": {"question": "2 + 2 = ?", "choices": ["3", "4", "5", "6"], "answer": 1},
}


def _write(root: Path, relative: str, lines: list[str]) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _no_env_data(monkeypatch, tmp_path_factory):
    """No local data, private (empty) caches, and a hub endpoint nobody listens on: offline, deterministically."""
    monkeypatch.delenv(DATA_ENV_VAR, raising=False)
    caches = tmp_path_factory.mktemp("caches")
    monkeypatch.setenv(hub.CACHE_ENV_VAR, str(caches / "deliberation_env"))
    monkeypatch.setenv("HF_HOME", str(caches / "huggingface"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                 "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")


def _closed_port() -> int:
    """A local TCP port with no listener (connections are refused at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def live_hub(monkeypatch):
    """A TCP listener standing in for a reachable hub endpoint (the `datasets` calls themselves are faked)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        yield server


@pytest.mark.parametrize("name", sorted(FILES))
def test_construction_is_lazy_and_splits_are_checked(name, tmp_path):
    task = TASKS.make(name, data_dir=tmp_path / "nowhere")  # reads nothing yet
    assert isinstance(task, BaseTask) and task.name == name
    with pytest.raises(ValueError, match="has splits .*'test'"):
        task.problems("nonexistent")


@pytest.mark.parametrize("name", sorted(FILES))
def test_missing_file_names_env_var_path_and_hub_id(name, tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        TASKS.make(name, data_dir=str(tmp_path)).problems("test")
    message = str(error.value)
    assert DATA_ENV_VAR in message and str(tmp_path / FILES[name]) in message and HUB_IDS[name] in message
    assert f"a data folder holding {FILES[name]}" in message and "docs/tasks.md" in message and "shared/" not in message


@pytest.mark.parametrize("name", sorted(FILES))
def test_no_local_data_and_no_hub_names_env_var_path_and_hub_id(name, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails: no hub here
    with pytest.raises(FileNotFoundError) as error:
        TASKS.make(name).problems("test")
    message = str(error.value)
    assert DATA_ENV_VAR in message and FILES[name] in message and HUB_IDS[name] in message
    assert f"a data folder holding {FILES[name]}" in message and "docs/tasks.md" in message and "shared/" not in message


@pytest.mark.parametrize("name", sorted(FILES))
def test_env_var_is_used_when_data_dir_is_not_given(name, tmp_path, monkeypatch):
    _write(tmp_path, FILES[name], [json.dumps(GOOD_ROWS[name])] * 2)
    monkeypatch.setenv(DATA_ENV_VAR, str(tmp_path))
    task = TASKS.make(name)
    problems = task.problems("test")
    assert len(problems) == 2 and task.problems("test") is problems  # cached
    assert task.grade(problems[0], problems[0].answer)


@pytest.mark.parametrize("name", sorted(FILES))
@pytest.mark.parametrize(
    ("line", "reason"),
    [("{not json", "invalid JSON"), ("[1, 2]", "expected a JSON object"), ("{}", "missing field")],
)
def test_malformed_row_names_file_and_line(name, line, reason, tmp_path):
    good = json.dumps(GOOD_ROWS[name])
    path = _write(tmp_path, FILES[name], [good, good, line, good])
    with pytest.raises(DataFormatError, match=reason) as error:
        TASKS.make(name, data_dir=tmp_path).problems("test")
    assert f"{path}, line 3" in str(error.value)


@pytest.mark.parametrize(
    ("name", "field", "value", "reason"),
    [
        ("gsm8k", "answer", 5, "should be str"),
        ("gsm8k", "answer", "no final line", "#### N"),
        ("math", "problem", ["a list"], "should be str"),
        ("math", "level", 9, "level"),
        ("aime24", "answer", "twelve", "not a number"),
        ("aime24", "answer", "1000", "outside"),
        ("amc23", "answer", True, "should be"),
        ("mmlu", "answer", "E", "letter A-D"),
        ("mmlu", "choices", ["only", "three", "choices"], "list of 4"),
    ],
)
def test_wrong_type_or_value_names_file_and_line(name, field, value, reason, tmp_path):
    bad = dict(GOOD_ROWS[name], **{field: value})
    path = _write(tmp_path, FILES[name], [json.dumps(GOOD_ROWS[name]), "", json.dumps(bad)])
    with pytest.raises(DataFormatError, match=reason) as error:
        TASKS.make(name, data_dir=tmp_path).problems("test")
    assert f"{path}, line 3" in str(error.value)


def test_load_jsonl_reports_line_numbers_and_types(tmp_path):
    path = _write(tmp_path, "rows.jsonl", ['{"a": "x"}', "", '{"a": 3}'])
    with pytest.raises(DataFormatError, match=r"rows.jsonl, line 3: field 'a' should be str, got int"):
        load_jsonl(path, {"a": str})
    assert load_jsonl(path) == [(1, {"a": "x"}), (3, {"a": 3})]


def test_gzipped_jsonl_file(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps(GOOD_ROWS["gsm8k"]) + "\n")
    problems = TASKS.make("gsm8k", data_dir=path).problems("train")
    assert [p.answer for p in problems] == ["5"]


def _gzip_bytes(text: str) -> bytes:
    return gzip.compress(text.encode("utf-8"), mtime=0)


def _flip_byte(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0xFF]) + data[index + 1:]


GOOD_LINE = json.dumps(GOOD_ROWS["gsm8k"])
UNREADABLE = {  # file name -> (bytes, what the message must say); each file is otherwise a valid gsm8k split
    "binary.jsonl": ((GOOD_LINE + "\n").encode() * 2 + b"\x89PNG\r\n\x1a\n\x00\xff\xfe" + b"\n",
                     r"line 3: not UTF-8 text .*binary file"),
    "latin1.jsonl": (GOOD_LINE.encode() + b"\n" + '{"question": "caf\u00e9", "answer": "#### 1"}'.encode("latin-1"),
                     r"line 2: not UTF-8 text"),
    "not-gzip.jsonl.gz": ((GOOD_LINE + "\n").encode(), r"corrupt or truncated gzip file \(BadGzipFile.*at its start"),
    "truncated.jsonl.gz": (_gzip_bytes((GOOD_LINE + "\n") * 400)[:200], r"corrupt or truncated gzip file \(EOFError"),
    "flipped.jsonl.gz": (_flip_byte(_gzip_bytes(GOOD_LINE + "\n"), 30), r"corrupt or truncated gzip file"),
    "nested.jsonl": ((GOOD_LINE + "\n" + "[" * 100_000 + "]" * 100_000 + "\n").encode(), r"line 2: unreadable JSON"),
    "long-int.jsonl": ((GOOD_LINE + "\n" + "9" * 5000 + "\n").encode(), r"line 2: unreadable JSON \(ValueError"),
    "bad-json.jsonl": ((GOOD_LINE + "\n{oops\n").encode(), r"line 2: invalid JSON"),
}


@pytest.mark.parametrize("filename", sorted(UNREADABLE))
def test_unreadable_data_file_names_the_file_the_line_and_the_fix(filename, tmp_path):
    content, reason = UNREADABLE[filename]
    path = tmp_path / filename
    path.write_bytes(content)
    with pytest.raises(DataFormatError, match=reason) as error:
        TASKS.make("gsm8k", data_dir=path).problems("test")
    message = str(error.value)
    assert str(path) in message and len(message) < 1000, message
    if "JSON" not in reason:  # a damaged file: say how to get a good one
        assert "intact copy" in message and DATA_ENV_VAR in message
    if not filename.endswith(".gz"):  # the same through a data folder holding gsm8k/test.jsonl
        (tmp_path / "gsm8k").mkdir()
        (tmp_path / "gsm8k" / "test.jsonl").write_bytes(content)
        with pytest.raises(DataFormatError, match=reason):
            TASKS.make("gsm8k", data_dir=tmp_path).problems("test")


def test_unreadable_mmlu_csv_names_the_file_and_line(tmp_path):
    binary = tmp_path / "binary_test.csv"
    binary.write_bytes(MMLU_CSV[0].encode() + b"\n" + b"q,\xff\xfe,2,3,4,A\n")
    with pytest.raises(DataFormatError, match=r"binary_test.csv, line 2: not UTF-8 text.*intact copy"):
        TASKS.make("mmlu", data_dir=binary).problems("test")
    huge = tmp_path / "huge_test.csv"
    huge.write_bytes(MMLU_CSV[0].encode() + b"\n" + b'"' + b"x" * 200_000 + b'",1,2,3,4,A\n')
    with pytest.raises(DataFormatError, match=r"huge_test.csv, line 2: not a readable CSV row .*field limit"):
        TASKS.make("mmlu", data_dir=huge).problems("test")
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    with pytest.raises(DataFormatError, match=r"folder.jsonl: cannot be read"):
        load_jsonl(folder)


def test_gsm8k_limit_and_a_single_file_as_data_dir(data_dir):
    task = TASKS.make("gsm8k", data_dir=data_dir / "gsm8k" / "train.jsonl", limit=5)
    assert [p.id for p in task.problems("test")] == [f"gsm8k-test-{i}" for i in range(5)]
    with pytest.raises(ValueError, match="limit"):
        TASKS.make("gsm8k", limit=0)


# ------------------------------------------------------------------------------ MMLU layouts
MMLU_CSV = ['"What is 2 + 2?",3,4,5,6,B', '"Which, of these, is prime?",4,6,7,9,C']


@pytest.mark.parametrize("layout", ["mmlu/test", "test"])
def test_mmlu_original_csv_folders(layout, tmp_path):
    _write(tmp_path, f"{layout}/elementary_mathematics_test.csv", MMLU_CSV)
    _write(tmp_path, f"{layout}/college_physics_test.csv", ['"Unit of force?",joule,newton,watt,pascal,B'])
    problems = TASKS.make("mmlu", data_dir=tmp_path).problems("test")
    assert [p.answer for p in problems] == ["B", "B", "C"]
    assert [p.metadata["subject"] for p in problems] == ["college_physics"] + ["elementary_mathematics"] * 2
    assert "(C) 7" in problems[2].question and "Which, of these, is prime?" in problems[2].question
    only = TASKS.make("mmlu", data_dir=tmp_path, subjects=["college_physics"]).problems("test")
    assert len(only) == 1


def test_mmlu_jsonl_layout_comes_before_csv_folders(tmp_path):
    _write(tmp_path, "mmlu/test/anatomy_test.csv", MMLU_CSV)
    _write(tmp_path, "mmlu_stem/test.jsonl", [json.dumps(GOOD_ROWS["mmlu"])])
    assert len(TASKS.make("mmlu", data_dir=tmp_path).problems("test")) == 1


def test_mmlu_single_csv_file_and_bad_csv_line(tmp_path):
    path = _write(tmp_path, "anatomy_test.csv", MMLU_CSV)
    problems = TASKS.make("mmlu", data_dir=path).problems("test")
    assert [p.answer for p in problems] == ["B", "C"] and problems[0].metadata["subject"] == "anatomy"
    bad = _write(tmp_path, "bad_test.csv", [MMLU_CSV[0], "too,few,columns"])
    with pytest.raises(DataFormatError, match=r"bad_test.csv, line 2: expected 6 columns"):
        TASKS.make("mmlu", data_dir=bad).problems("test")
    _write(tmp_path, "mmlu/test/good_test.csv", MMLU_CSV)
    _write(tmp_path, "mmlu/test/worse_test.csv", [MMLU_CSV[0], MMLU_CSV[1], "q,1,2,3,4,E"])
    with pytest.raises(DataFormatError, match=r"worse_test.csv, line 3: 'answer' should be .* got 'E'"):
        TASKS.make("mmlu", data_dir=tmp_path).problems("test")


@pytest.mark.parametrize(
    ("row", "gold"),
    [
        ({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "B"}, "B"),  # letter
        ({"question": "q", "choices": ["a", "b", "c", "d"], "answer": "2"}, "C"),  # digit string (0-based)
        ({"question": "q", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 3}, "D"),  # cais/mmlu
        ({"question": "q", "A": "a", "B": "b", "C": "c", "D": "d", "answer": "A"}, "A"),  # A-D columns
    ],
)
def test_mmlu_other_row_layouts(row, gold, tmp_path):
    _write(tmp_path, "mmlu/test.jsonl", [json.dumps(row)])
    problem = TASKS.make("mmlu", data_dir=tmp_path).problems("test")[0]
    assert problem.answer == gold and "(D) d" in problem.question


# ------------------------------------------------------------------------------ prompts
@pytest.mark.parametrize("name", sorted(FILES))
def test_prompts_fit_the_task_and_can_be_overridden(name, data_dir):
    task = TASKS.make(name, data_dir=data_dir)
    problem = task.problems("test")[0]
    solve = task.solve_messages(problem)[-1].content
    assert problem.question in solve
    expected = {"gsm8k": "The answer is N", "math": "\\boxed{}", "aime24": "integer from 0 to 999",
                "amc23": "\\boxed{}", "mmlu": "The answer is (X)"}[name]
    assert expected in solve
    assert task.refine_messages(problem, "my work", [])[-1].content
    assert "Confidence" in task.critic_messages(problem, "my work")[-1].content
    task.with_prompts(solve="Just answer: {question}")
    assert task.solve_messages(problem)[-1].content == f"Just answer: {problem.question}"


# ------------------------------------------------------------------------------ hub (no network in tests)
class _FakeDatasets:
    """Stands in for the `datasets` package: records the call, returns rows or fails."""

    def __init__(self, rows=None, error=None):
        self.rows, self.error, self.calls = rows, error, []

    def load_dataset(self, hub_id, config, split):
        self.calls.append((hub_id, config, split))
        if self.error:
            raise self.error
        return list(self.rows)


@pytest.mark.parametrize(
    ("name", "call"),
    [("gsm8k", ("openai/gsm8k", "main", "test")), ("math", ("HuggingFaceH4/MATH-500", None, "test")),
     ("aime24", ("HuggingFaceH4/aime_2024", None, "train")), ("amc23", ("math-ai/amc23", None, "test")),
     ("mmlu", ("cais/mmlu", "all", "test"))],
)
def test_hub_is_the_last_resort_and_its_rows_are_cached(name, call, monkeypatch, live_hub):
    fake = _FakeDatasets(rows=[GOOD_ROWS[name]] * 3)
    monkeypatch.setitem(sys.modules, "datasets", fake)
    task = TASKS.make(name)
    assert len(task.problems("test")) == 3 and fake.calls == [call]
    assert task.grade(task.problems("test")[0], task.problems("test")[0].answer)
    cached = hub.cached_path(call[0], call[1], call[2])
    assert cached.is_file() and str(cached).startswith(str(hub.cache_dir()))
    # later runs: offline, even without `datasets`, from the cache
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    assert [p.answer for p in TASKS.make(name).problems("test")] == [p.answer for p in task.problems("test")]


def test_failed_hub_load_and_bad_hub_rows_are_explained(monkeypatch, live_hub):
    monkeypatch.setitem(sys.modules, "datasets", _FakeDatasets(error=ConnectionError("offline")))
    with pytest.raises(FileNotFoundError, match=r"openai/gsm8k.*ConnectionError: offline.*DELIBERATION_ENV_DATA"):
        TASKS.make("gsm8k").problems("test")
    assert not hub.cached_path("openai/gsm8k", "main", "test").exists()  # nothing half-written
    monkeypatch.setitem(sys.modules, "datasets", _FakeDatasets(rows=[GOOD_ROWS["gsm8k"], {"question": "q"}]))
    with pytest.raises(DataFormatError, match=r"hub dataset 'openai/gsm8k' \(test\), row 2: missing field 'answer'"):
        TASKS.make("gsm8k").problems("test")


@pytest.mark.parametrize("name", [*sorted(FILES), "humaneval"])
def test_offline_the_design_card_call_fails_fast_with_the_instruction(name):
    """`parallel_env(task=...)` with no data and an unreachable hub: the real `datasets`, no 25 s of retries."""
    start = time.monotonic()
    with pytest.raises(FileNotFoundError) as error:
        deliberation_env.parallel_env(task=name, split="test")
    elapsed = time.monotonic() - start
    message = str(error.value)
    assert elapsed < 5.0, f"took {elapsed:.1f} s"
    assert "\n" not in message and DATA_ENV_VAR in message and "data_dir=" in message and "go online" in message
    assert "unreachable" in message and "Connection refused" in message and (HUB_IDS.get(name) or "humaneval") in message


@pytest.mark.parametrize("name", ["math", "aime24", "amc23", "mmlu", "humaneval"])
def test_a_benchmark_without_a_training_split_is_not_played_by_default(name):
    """The envs' split defaults to 'train': a test-only benchmark is played on its test split only when asked."""
    with pytest.raises(ValueError, match=f"{name} has splits .*got 'train' .*evaluate on it with split='test'"):
        deliberation_env.parallel_env(task=name)


def test_offline_mode_variable_counts_as_unreachable(monkeypatch, live_hub):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake = _FakeDatasets(rows=[GOOD_ROWS["gsm8k"]])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set.*not cached"):
        TASKS.make("gsm8k").problems("test")
    assert fake.calls == []


def test_offline_a_split_in_the_hugging_face_cache_still_loads(tmp_path):
    """Users who downloaded with `datasets` before keep working offline: the real `datasets`, in offline
    mode, reads its own cache (built here the way `load_dataset` leaves it) and we cache the rows."""
    datasets = pytest.importorskip("datasets", reason="datasets not installed: pip install datasets")
    source = tmp_path / "test.jsonl"
    source.write_text(json.dumps(GOOD_ROWS["gsm8k"]) + "\n")
    built = tmp_path / "built"
    datasets.load_dataset("json", data_files={"test": str(source)}, cache_dir=str(built))
    prepared = next(built.glob("json/*/*/*/dataset_info.json")).parent
    target = Path(hub.os.environ["HF_HOME"]) / "datasets" / "openai___gsm8k" / "main" / prepared.parent.name / "0"
    target.parent.mkdir(parents=True)
    prepared.rename(target)
    next(target.glob("json-test*.arrow")).rename(target / "gsm8k-test.arrow")
    info = json.loads((target / "dataset_info.json").read_text())
    (target / "dataset_info.json").write_text(json.dumps({**info, "config_name": "main", "dataset_name": "gsm8k",
                                                          "builder_name": "gsm8k"}))
    assert hub.in_hf_cache("openai/gsm8k") and not hub.in_hf_cache("openai/other")
    problems = TASKS.make("gsm8k").problems("test")  # the hub endpoint is closed
    assert [p.answer for p in problems] == ["5"] and hub.cached_path("openai/gsm8k", "main", "test").is_file()


def test_subject_filter_that_matches_nothing_is_an_error(data_dir):
    task = TASKS.make("mmlu", data_dir=data_dir, subjects=["astrology"])
    with pytest.raises(ValueError, match="no test problems left"):
        task.problems("test")
    physics = TASKS.make("mmlu", data_dir=data_dir, subjects=["college_physics"]).problems("test")
    assert physics and {p.metadata["subject"] for p in physics} == {"college_physics"}

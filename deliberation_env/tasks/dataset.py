"""Base classes of the data-backed tasks: lazy loading, split handling, data resolution.

Where a split's rows come from, in order:

1. ``data_dir=``: a data folder holding each split's file at its relative path (``Source.relative``, e.g.
   ``gsm8k/test.jsonl``; the layout is in docs/tasks.md), or one data file used for every split;
2. ``$DELIBERATION_ENV_DATA``: a data folder laid out the same way;
3. the Hugging Face hub through ``datasets`` (``tasks.hub``: the network once, then a local cache).

Rows are checked (``fields``) and converted to ``Problem`` objects once, on the first
``problems(split)`` call; constructing a task reads nothing.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from deliberation_env.tasks.base import BaseTask, Problem, Prompts, resolve_data_file, unknown_split
from deliberation_env.tasks.extract import DataFormatError, FieldSpec, check_fields, convert_rows, is_text, load_jsonl
from deliberation_env.tasks.hub import hub_rows
from deliberation_env.tasks.numeric import extract_number, numbers_equal, numeric_distractors

Rows = list[tuple[int, dict[str, Any]]]


@dataclass(frozen=True)
class Source:
    """Where one split lives: a path under the data folder, and the hub dataset it mirrors."""

    relative: str
    hub_id: str
    hub_config: str | None = None
    hub_split: str = "test"


def load_hub_rows(source: Source, fields: FieldSpec) -> Rows:
    """Rows of a hub dataset (``tasks.hub.hub_rows``: cached locally, fast failure offline), checked
    against ``fields``; FileNotFoundError with the instruction when the hub cannot be used."""
    rows = hub_rows(source.hub_id, source.hub_config, source.hub_split, source.relative)
    where = f"hub dataset {source.hub_id!r} ({source.hub_split})"
    return [(number, check_fields(row, fields, f"{where}, row {number}")) for number, row in enumerate(rows, start=1)]


class DatasetTask(BaseTask):
    """A task whose problems come from a data file per split (see the module docstring).

    Subclasses set ``name``, ``sources`` (split -> Source), ``fields`` (required row fields),
    ``default_prompts`` and implement ``make_problem(row, index, split)``, which raises
    ValueError for a bad row (reported with the file and line).
    """

    sources: ClassVar[Mapping[str, Source]]
    fields: ClassVar[FieldSpec] = {}
    default_prompts: ClassVar[Prompts]

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, limit: int | None = None,
                 prompts: Prompts | None = None):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
        self.data_dir = data_dir
        self.limit = limit
        self.prompts = prompts or self.default_prompts
        self._problems: dict[str, list[Problem]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(data_dir={self.data_dir!r}, limit={self.limit!r})"

    # ------------------------------------------------------------------ loading
    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of ``split`` in file order (loaded once, then cached)."""
        if split not in self.sources:
            raise unknown_split(self.name, list(self.sources), split)
        if split not in self._problems:
            rows, where, unit = self.load_rows(split)
            problems = convert_rows(rows, lambda row, index: self.make_problem(row, index, split), where, unit)
            if not problems:
                raise DataFormatError(f"{where}: no rows")
            problems = [problem for problem in problems if self.keep(problem)]
            if not problems:
                raise ValueError(f"{where}: no {split} problems left after filtering ({self!r})")
            self._problems[split] = problems[: self.limit]
        return self._problems[split]

    def load_rows(self, split: str) -> tuple[Rows, str, str]:
        """``(rows, source description, "line" or "row")`` for a split."""
        source = self.sources[split]
        path: Path | None
        if self.data_dir is not None and Path(self.data_dir).expanduser().is_file():
            path = Path(self.data_dir).expanduser()
        else:
            path = self.locate(split)
        if path is None:
            return load_hub_rows(source, self.fields), f"hub dataset {source.hub_id!r}", "row"
        return self.read_file(path), str(path), "line"

    def locate(self, split: str) -> Path | None:
        """The local file of ``split`` (``resolve_data_file``), or None to use the hub."""
        source = self.sources[split]
        return resolve_data_file(self.data_dir, source.relative, source.hub_id)

    def read_file(self, path: Path) -> Rows:
        """Rows of one local file (JSONL by default)."""
        return load_jsonl(path, self.fields)

    def make_problem(self, row: dict[str, Any], index: int, split: str) -> Problem:
        raise NotImplementedError

    def keep(self, problem: Problem) -> bool:
        """Whether a loaded problem belongs to this task's selection (all by default)."""
        return True


NO_ANSWER_TEXTS = (
    "I worked through several approaches but could not finish the computation, so I cannot commit to a result.",
    "My attempts led to contradictions and I was not able to settle on a result.",
    "I am unable to determine the result with confidence; my reasoning is incomplete.",
)
"""Texts with no digits, no choice letter and no answer marker: nothing can be extracted from them."""


class NumericTask(DatasetTask):
    """A dataset task whose answers are numbers: extraction, grading and sim support."""

    answer_range: ClassVar[tuple[int | None, int | None]] = (None, None)
    final_line: ClassVar[str] = "The answer is {answer}."

    def extract_answer(self, text: str) -> str | None:
        try:
            return extract_number(text)
        except Exception:  # never raise on model text
            return None

    def grade(self, problem: Problem, answer: str | None) -> bool:
        """Numeric equality; an answer with units or words ("18 dollars") is read with extract_number.
        Text that is not valid Unicode (lone surrogates) is wrong."""
        if not is_text(answer):
            return False
        try:
            if numbers_equal(answer, problem.answer):
                return True
            return isinstance(answer, str) and numbers_equal(extract_number(answer), problem.answer)
        except Exception:
            return False

    def intermediates(self, problem: Problem) -> list[str]:
        """Intermediate results of the worked solution, last first (distractor candidates)."""
        return []

    def rationale(self, problem: Problem, answer: str, rng: random.Random) -> list[str]:
        """Reasoning lines before the final line (may contain numbers)."""
        return [
            rng.choice(("Let me set up the quantities in the problem.", "First, I restate what is given.")),
            rng.choice(("Then I compute the required value step by step.", "Next, I work out each part carefully.")),
        ]

    def distractors(self, problem: Problem, rng: random.Random) -> list[str]:
        low, high = self.answer_range
        return numeric_distractors(problem.answer, self.intermediates(problem), low, high)

    def render_solution(self, problem: Problem, answer: str | None, rng: random.Random) -> str:
        if answer is None:
            return rng.choice(NO_ANSWER_TEXTS)
        lines = self.rationale(problem, answer, rng)
        return "\n".join([*lines, self.final_line.format(answer=answer)])

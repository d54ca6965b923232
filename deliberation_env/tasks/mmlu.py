"""MMLU multiple choice (Hendrycks et al., 2021); by default the STEM subjects.

Data: ``mmlu_stem/test.jsonl`` (3,018 rows: ``question``, ``type`` (subject), ``choices`` (4
strings), ``answer`` (index 0-3)); hub ``cais/mmlu`` config ``all``. Other layouts load too:

- JSONL rows with ``answer`` as a letter (``"B"``) or a digit string (``"1"``, a 0-based index
  like the integer), and/or ``A``..``D`` columns instead of ``choices``; ``subject`` or ``type``;
- the original CSV files (no header: question, A, B, C, D, answer letter), either a folder
  ``mmlu/<split>/*.csv`` (or ``<split>/*.csv``, the original ``data`` folder; ``val`` for
  ``validation``) under the data folder, or a single ``.csv`` file passed as ``data_dir``.

The gold answer is a letter A-D. ``Problem.question`` holds the question and the lettered
choices. Extraction finds the chosen letter ("(B)", "B)", "**B**", "The answer is B",
"Answer: B", "\\boxed{B}", a final line "B.") and, given the problem, the text of a choice.
"""

from __future__ import annotations

import csv
import os
import random
import re
import zlib
from pathlib import Path
from typing import Any

from deliberation_env.tasks.base import DATA_ENV_VAR, Problem, Prompts
from deliberation_env.tasks.dataset import NO_ANSWER_TEXTS, DatasetTask, Rows, Source
from deliberation_env.tasks.extract import (
    REPLACE_ADVICE,
    DataFormatError,
    after_answer_marker,
    first_sentence,
    is_text,
    last_boxed,
    read_lines,
)

LETTERS = "ABCD"
PROMPTS = Prompts(
    system="You are an expert in science, technology, engineering and mathematics.",
    solve=(
        "Answer the following multiple choice question. Think step by step, then end with a line "
        "'The answer is (X)' where X is one of A, B, C or D.\n\n{question}"
    ),
    refine=(
        "{question}\n\nYour previous answer:\n{own_solution}\n\n"
        "Other agents' answers:\n{peer_solutions}\n\n"
        "Re-examine the question, using their reasoning where it helps. Think step by step, then end "
        "with a line 'The answer is (X)' where X is one of A, B, C or D."
    ),
    critic=(
        "{question}\n\nProposed answer:\n{solution}\n\n"
        "Is the chosen option correct? Reply 'Yes' or 'No', then 'Confidence: p' with p between 0 and 1."
    ),
)

_LETTER = r"(?<![A-Za-z0-9])[\(\[*_ ]{0,4}([A-D])[\)\]*_]{0,4}(?![A-Za-z0-9])"
_LETTER_RE = re.compile(_LETTER)
_LEAD_RE = re.compile(r"(?:option|choice)?[ \t]{0,3}" + _LETTER, re.IGNORECASE)
_LAST_LINE_RE = re.compile(r"[ \t>*_#]{0,6}\(?([A-D])(?:[).:]|\**[ \t]{0,3}$)")
_CLAIM_RE = re.compile(r"(?i:\bis|\bchoose|\bselect|\boption|\bchoice|\bwith)[ \t]{1,3}\(?([A-D])\)?(?![A-Za-z0-9])")
_PAREN_RE = re.compile(r"\(([A-D])\)")
_TEXT_WRAP_RE = re.compile(r"\\text(?:bf)?\{([^{}]{0,200})\}")


def gold_letter(answer: Any) -> str:
    """The gold letter of an ``answer`` cell: an index 0-3 (int or digit string) or a letter."""
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer <= 3:
        return LETTERS[answer]
    if isinstance(answer, str):
        text = answer.strip().strip("()").upper()
        if text in ("0", "1", "2", "3"):
            return LETTERS[int(text)]
        if text in ("A", "B", "C", "D"):
            return text
    raise ValueError(f"'answer' should be an index 0-3 or a letter A-D, got {answer!r}")


def format_question(question: str, choices: list[str]) -> str:
    """The question followed by its lettered choices, one a line: ``(A) ...``."""
    options = "\n".join(f"({letter}) {choice}" for letter, choice in zip(LETTERS, choices))
    return f"{question.strip()}\n\n{options}"


def _canonical(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def choice_letter(text: str, choices: list[str] | None = None) -> str | None:
    """The choice letter in an LLM's text, or None (never raises; linear time).

    In order: ``\\boxed{B}``; the letter after the last answer marker ("The answer is (B)",
    "Answer: **B**", "The correct option is B"); a last line starting with a letter ("B.",
    "(B) ...", "B) ...", "**B**") or ending with "is C", "choose C"; the last "(B)" in the last 2,000 characters; else, with
    ``choices``, the choice whose text is the boxed or marked answer or the last line.
    """
    if not isinstance(text, str):
        return None
    try:
        boxed = last_boxed(text)
        marked = after_answer_marker(text)
        for window in (boxed, marked):
            if window:
                window = _TEXT_WRAP_RE.sub(r"\1", window).lstrip("$:*_ ")
                match = _LEAD_RE.match(window) or _LETTER_RE.search(first_sentence(window))
                if match:
                    return match.group(1)
        lines = text[-2000:].strip().splitlines()
        last_line = lines[-1] if lines else ""
        match = _LAST_LINE_RE.match(last_line)
        if match:
            return match.group(1)
        claims = _CLAIM_RE.findall(last_line[-500:])
        if claims:
            return claims[-1]
        found = _PAREN_RE.findall(text[-2000:])
        if found:
            return found[-1]
        if choices:
            for candidate in (boxed, marked, last_line):
                if candidate:
                    wanted = _canonical(_TEXT_WRAP_RE.sub(r"\1", candidate))
                    hits = [LETTERS[i] for i, choice in enumerate(choices) if wanted and _canonical(choice) == wanted]
                    if len(hits) == 1:
                        return hits[0]
        return None
    except Exception:
        return None


class MMLUTask(DatasetTask):
    """MMLU multiple choice (STEM subset by default); exact grading of the letter."""

    name = "mmlu"
    sources = {
        "test": Source("mmlu_stem/test.jsonl", "cais/mmlu", "all", "test"),
        "validation": Source("mmlu_stem/validation.jsonl", "cais/mmlu", "all", "validation"),
        "dev": Source("mmlu_stem/dev.jsonl", "cais/mmlu", "all", "dev"),
    }
    fields = {"question": str}
    default_prompts = PROMPTS

    def __init__(self, data_dir: Any = None, *, subjects: list[str] | tuple[str, ...] | None = None, **kwargs: Any):
        super().__init__(data_dir, **kwargs)
        self.subjects = frozenset(subjects) if subjects is not None else None

    def __repr__(self) -> str:
        subjects = sorted(self.subjects) if self.subjects is not None else None
        return f"MMLUTask(data_dir={self.data_dir!r}, subjects={subjects!r}, limit={self.limit!r})"

    # ------------------------------------------------------------------ loading
    def keep(self, problem: Problem) -> bool:
        return self.subjects is None or problem.metadata["subject"] in self.subjects

    def locate(self, split: str) -> Path | None:
        """``mmlu_stem/<split>.jsonl``, else ``mmlu/<split>.jsonl``, ``mmlu/<split>/``, ``<split>/``
        (folders of original CSV files) under ``data_dir`` or ``$DELIBERATION_ENV_DATA``."""
        folder = {"validation": "val"}.get(split, split)
        for base in (self.data_dir, os.environ.get(DATA_ENV_VAR)):
            if not base:
                continue
            root = Path(base).expanduser()
            for relative in (self.sources[split].relative, f"mmlu/{split}.jsonl", f"mmlu/{folder}", folder):
                candidate = root / relative
                if candidate.is_file() or (candidate.is_dir() and any(candidate.glob("*.csv"))):
                    return candidate
            break  # only the first configured folder counts, as in resolve_data_file
        try:
            return super().locate(split)
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"{error} MMLU also accepts mmlu/{split}.jsonl or folders of the original CSV files "
                f"(mmlu/{folder}/*.csv or {folder}/*.csv) there."
            ) from None

    def read_file(self, path: Path) -> Rows:
        if path.is_dir():
            rows: Rows = []
            for file in sorted(path.glob("*.csv")):
                rows += self._read_csv(file)
            return rows
        if path.suffix == ".csv":
            return self._read_csv(path)
        return super().read_file(path)

    @staticmethod
    def _read_csv(path: Path) -> Rows:
        """Rows of an original MMLU CSV file (no header: question, A, B, C, D, answer)."""
        subject = path.stem.removesuffix("_test").removesuffix("_val").removesuffix("_dev")
        rows: Rows = []
        reader = csv.reader(line for _, line in read_lines(path))
        try:
            for cells in reader:
                if not any(cell.strip() for cell in cells):
                    continue
                where = f"{path}, line {reader.line_num}"
                if len(cells) != 6:
                    raise DataFormatError(f"{where}: expected 6 columns (question, A, B, C, D, answer), got {len(cells)}")
                try:
                    gold_letter(cells[5])
                except ValueError as error:
                    raise DataFormatError(f"{where}: {error}") from None
                row = {"question": cells[0], "choices": cells[1:5], "answer": cells[5], "subject": subject}
                rows.append((reader.line_num, row))
        except csv.Error as error:  # a NUL byte, an over-long field, an unterminated quote
            raise DataFormatError(f"{path}, line {reader.line_num}: not a readable CSV row ({error}). "
                                  f"{REPLACE_ADVICE}.") from None
        return rows

    def make_problem(self, row: dict[str, Any], index: int, split: str) -> Problem:
        choices = row.get("choices")
        if choices is None and all(letter in row for letter in LETTERS):
            choices = [row[letter] for letter in LETTERS]
        if not isinstance(choices, list) or len(choices) != 4 or not all(isinstance(c, (str, int, float)) for c in choices):
            raise ValueError(f"'choices' should be a list of 4 strings (or columns A-D), got {choices!r:.80}")
        if "answer" not in row:
            raise ValueError("missing field 'answer'")
        choices = [str(choice) for choice in choices]
        subject = str(row.get("subject") or row.get("type") or "unknown")
        return Problem(
            id=f"mmlu-{split}-{index}",
            question=format_question(row["question"], choices),
            answer=gold_letter(row["answer"]),
            metadata={"subject": subject, "choices": choices},
        )

    # ------------------------------------------------------------------ answers
    def extract_answer(self, text: str, problem: Problem | None = None) -> str | None:
        """The chosen letter; with ``problem``, the text of a choice also counts."""
        return choice_letter(text, problem.metadata.get("choices") if problem is not None else None)

    def grade(self, problem: Problem, answer: str | None) -> bool:
        if not is_text(answer):  # None, or text that is not valid Unicode
            return False
        letter = answer.strip().strip("()").upper()
        if letter not in LETTERS:
            letter = choice_letter(answer, problem.metadata.get("choices")) or ""
        return letter == problem.answer

    def distractors(self, problem: Problem, rng: random.Random) -> list[str]:
        """The other letters, in an order fixed per problem."""
        others = [letter for letter in LETTERS if letter != problem.answer]
        random.Random(zlib.crc32(problem.id.encode())).shuffle(others)
        return others

    def render_solution(self, problem: Problem, answer: str | None, rng: random.Random) -> str:
        if answer is None:
            return rng.choice(NO_ANSWER_TEXTS)
        lines = [rng.choice(("Let me consider each option in turn.", "I recall the relevant facts first."))]
        if answer in LETTERS:
            lines.append(f"The best fit is: {problem.metadata['choices'][LETTERS.index(answer)]}")
        lines.append(f"The answer is ({answer}).")
        return "\n".join(lines)

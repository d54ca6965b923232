"""HumanEval (164 Python function-completion problems), graded by running the official tests.

Data: ``data_dir`` / ``$DELIBERATION_ENV_DATA`` + ``humaneval/HumanEval.jsonl.gz`` (the openai/human-eval
file), else the Hugging Face hub (``openai/openai_humaneval``, needs ``datasets``). Split ``test``.

Answers are programs. ``extract_answer`` takes the last fenced python block that defines a function
(else the last code-like block, else code found in unfenced text) and normalises it: line endings,
trailing whitespace, a consistent dedent, no leading/trailing blank lines, no ``if __name__ ==
"__main__":`` block. A full program (it has a top-level ``def``) is kept as such; a body-only
completion is indented by four spaces, and, when the problem is known (``extract_answer(text,
problem)``), prefixed with the prompt so that it becomes the full program. ``Problem.answer`` is the
gold program in the same form: normalise(prompt + canonical solution).

``grade`` is pass@1: the prompt (for its imports and helpers), the program, the official ``test``
and ``check(entry_point)`` run in ``deliberation_env.sandbox``; results are cached by
(task id, program hash).

For the simulated backend, ``distractors`` are mutants of the canonical solution (a swapped
comparison, an off-by-one constant, a swapped operator, a flipped boolean, ``and``/``or``, a
function returning None), each verified in the sandbox to fail the tests quickly (no time-outs).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import random
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from deliberation_env.sandbox import (
    ISOLATION_MODES,
    SandboxUnavailableError,
    available_isolation,
    isolation_works,
    run_many,
)
from deliberation_env.tasks.base import BaseTask, Problem, Prompts, resolve_data_file, unknown_split
from deliberation_env.tasks.extract import DataFormatError, is_text, parse_json_line, read_lines
from deliberation_env.tasks.hub import hub_rows

RELATIVE_PATH = "humaneval/HumanEval.jsonl.gz"
HUB_ID = "openai/openai_humaneval"
SPLITS = ("test",)
FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")

PROMPTS = Prompts(
    system="You are an expert Python programmer.",
    solve=(
        "Complete the following Python function. Reply with the complete function (its signature, body and "
        "any imports it needs) in a single ```python code block.\n\n```python\n{question}```"
    ),
    refine=(
        "Task:\n```python\n{question}```\n\nYour previous attempt:\n{own_solution}\n\n"
        "Other agents' solutions:\n{peer_solutions}\n\n"
        "Check each solution against the docstring and its examples, including edge cases, and use the other "
        "agents' code where it helps. Then reply with your final complete function in a single ```python code block."
    ),
    critic=(
        "Task:\n```python\n{question}```\n\nProposed solution:\n{solution}\n\n"
        "Does this code correctly implement the function for every input the docstring allows? "
        "Reply 'Yes' or 'No', then 'Confidence: p' with p between 0 and 1."
    ),
    peer="Agent {index}'s code:\n```python\n{answer}\n```",
)

# ------------------------------------------------------------------------------------ extraction
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_CODE_LANGS = {"", "python", "py", "python3", "py3", "ipython", "pycon"}
_MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""")
_CODE_START = re.compile(r"^(?:from\s+[\w.]+\s+import\s|import\s+\w|(?:async\s+)?def\s+\w+\s*\(|class\s+\w+|@\w)")
_TOP_CODE = re.compile(r"^(?:from\s|import\s|(?:async\s+)?def\s|class\s|@|#|if\s+__name__|[A-Za-z_][\w.\[\], ]*\s*[-+*/]?=(?!=))")
_SUBSTANTIVE = (ast.Return, ast.Assign, ast.AugAssign, ast.For, ast.While, ast.If, ast.With,
                ast.Try, ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Raise, ast.Assert)


def normalize_code(code: str) -> str:
    """Canonical text of a program: LF line ends, no trailing whitespace, dedented, no main guard."""
    lines = [line.rstrip() for line in code.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    lines = textwrap.dedent("\n".join(lines)).split("\n")
    kept: list[str] = []
    skipping = False
    for line in lines:
        if _MAIN_GUARD.match(line):
            skipping = True
            continue
        if skipping and (not line or line[0].isspace()):
            continue
        skipping = False
        kept.append(line)
    return "\n".join(kept).strip("\n")


def defines(code: str, name: str | None = None) -> bool:
    """Whether ``code`` has a top-level ``def name(`` (any function when ``name`` is None)."""
    pattern = re.escape(name) if name else r"\w+"
    return re.search(rf"^(?:async\s+)?def\s+{pattern}\s*\(", code, re.M) is not None


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _compiles(code: str) -> bool:
    try:
        compile(code, "<answer>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _is_body(code: str, need_return: bool = False) -> bool:
    """Whether dedented ``code`` is a function body doing something (not prose, not a bare name)."""
    wrapped = "def _f():\n" + textwrap.indent(code, "    ", lambda line: True)
    tree = _parses(wrapped)
    if tree is None or not _compiles(wrapped):
        return False
    body = cast(ast.FunctionDef, tree.body[0]).body  # wrapped is one "def _f()"
    if need_return and not any(isinstance(node, ast.Return) for node in ast.walk(tree)):
        return False
    return any(isinstance(node, _SUBSTANTIVE) for node in body) or any(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) for node in body)


def _body_form(code: str) -> str:
    return textwrap.indent(code, "    ")


def _unfenced_code(text: str, entry: str | None) -> str | None:
    """Code in text without fences: a raw (indented) completion, a program amid prose, or a bare body."""
    lines = text.replace("\r\n", "\n").split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return None
    if lines[first][0].isspace():  # a raw completion: the indented body (or indented program), up to a dedent
        block = []
        for line in lines[first:]:
            if line.strip() and not line[0].isspace():
                break
            block.append(line)
        candidate = normalize_code("\n".join(block))
        return candidate if _is_body(candidate) else None
    starts = [i for i, line in enumerate(lines) if _CODE_START.match(line)]
    if starts and any(defines(line, entry) or defines(line) for line in lines):
        block = [lines[starts[0]]]
        for line in lines[starts[0] + 1:]:
            if line.strip() and not line[0].isspace() and not _TOP_CODE.match(line):
                break
            block.append(line)
        while len(block) > 1 and _parses("\n".join(block)) is None:  # trim trailing prose
            block.pop()
        return normalize_code("\n".join(block))
    candidate = normalize_code(text)  # bare text: only a body that returns something counts as code
    return candidate if candidate and _is_body(candidate, need_return=True) else None


def find_code(text: str, entry: str | None = None) -> str | None:
    """The normalised code an LLM wrote (full program or dedented body), or None."""
    blocks = [normalize_code(body) for lang, body in _FENCE.findall(text) if lang.lower() in _CODE_LANGS]
    blocks = [block for block in blocks if block]
    if blocks:
        with_def = [b for b in blocks if defines(b, entry)] or [b for b in blocks if defines(b)]
        if with_def:
            return with_def[-1]
        bodies = [b for b in blocks if _is_body(b)]
        return bodies[-1] if bodies else None
    return _unfenced_code(text, entry)


def extract_program(text: str, problem: Problem | None = None) -> str | None:
    """The answer in an LLM's text: a full program, or (problem unknown) a four-space-indented body."""
    entry = problem.metadata.get("entry_point") if problem is not None else None
    code = find_code(text, entry)
    if code is None:
        return None
    if (entry is not None and defines(code, entry)) or (defines(code) and _compiles(code)):
        return code
    body = _body_form(code)
    return normalize_code(problem.question + body) if problem is not None else body


def build_program(problem: Problem, answer: str) -> str:
    """The test program for an answer: prompt (imports, helpers), the answer, the tests, the check."""
    entry = problem.metadata["entry_point"]
    if defines(answer):
        program = problem.question + "\n" + answer
    else:
        body = answer if answer[:1].isspace() else _body_form(textwrap.dedent(answer))
        program = problem.question + body
    return f"{program}\n\n{problem.metadata['test']}\n\ncheck({entry})\n"


# ------------------------------------------------------------------------------------ mutations
_COMPARE_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BINOP_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv}


def _sites(function: ast.FunctionDef) -> list[tuple[int, bool]]:
    """Mutable nodes of a function (by ``ast.walk`` index), each with 'inside a while loop'."""
    in_while: set[int] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.While):
            in_while.update(id(child) for child in ast.walk(node))
    sites = []
    for index, node in enumerate(ast.walk(function)):
        mutable = (
            isinstance(node, ast.Compare) and type(node.ops[0]) in _COMPARE_SWAP
            or isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP
            or isinstance(node, ast.BoolOp)
            or isinstance(node, ast.Constant) and type(node.value) in (int, bool)
        )
        if mutable:
            sites.append((index, id(node) in in_while))
    return sites


def _mutate(node: ast.AST) -> None:
    if isinstance(node, ast.Compare):
        node.ops[0] = _COMPARE_SWAP[type(node.ops[0])]()
    elif isinstance(node, ast.BinOp):
        node.op = _BINOP_SWAP[type(node.op)]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            node.value = not value
        elif isinstance(value, (int, float, complex)):
            node.value = value + 1
        else:  # _sites picks only int and bool constants
            raise TypeError(f"cannot mutate the constant {value!r}")


def mutants(program: str, entry: str, rng: random.Random) -> list[str]:
    """Broken variants of ``program``'s ``entry`` function (one mutation each; 'return None' last)."""
    tree = _parses(program)
    function = next((n for n in (tree.body if tree else []) if isinstance(n, ast.FunctionDef) and n.name == entry), None)
    if function is None:
        return []
    body = function.body
    first = body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str)
    statements = body[1:] if has_doc else body
    if not statements:
        return []
    lines = program.split("\n")
    head, tail = lines[: statements[0].lineno - 1], lines[function.end_lineno:]
    indent = " " * statements[0].col_offset

    def render(function_copy: ast.FunctionDef) -> str:
        new_body = function_copy.body[1:] if has_doc else function_copy.body
        code = "\n".join(textwrap.indent(ast.unparse(stmt), indent) for stmt in new_body)
        return normalize_code("\n".join([*head, code, *tail]))

    sites = _sites(function)
    rng.shuffle(sites)
    sites.sort(key=lambda site: site[1])  # mutations inside while loops last: they tend to hang
    variants = []
    for index, _ in sites:
        clone = copy.deepcopy(function)
        _mutate(next(node for i, node in enumerate(ast.walk(clone)) if i == index))
        variants.append(render(clone))
    clone = copy.deepcopy(function)
    clone.body = [*clone.body[:1]] if has_doc else []
    clone.body.append(ast.Return(value=ast.Constant(value=None)))
    variants.append(render(clone))
    return list(dict.fromkeys(v for v in variants if v != normalize_code(program)))


# ------------------------------------------------------------------------------------ data
def check_row(row: object, where: str) -> dict[str, str]:
    """A HumanEval row (an object with the string fields ``FIELDS``), or DataFormatError naming ``where``."""
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    bad = [f for f in FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]
    if bad:
        raise DataFormatError(f"{where}: missing or non-string field(s) {bad}; a HumanEval row has {FIELDS}")
    return row


def load_rows(path: Path) -> list[dict[str, str]]:
    """HumanEval rows from a (gzipped) JSONL file; unreadable files and malformed rows raise
    DataFormatError (a ValueError) naming the file, the line and the fix."""
    return [check_row(parse_json_line(line, f"{path}:{number}"), f"{path}:{number}")
            for number, line in read_lines(path) if line.strip()]


def _hub_rows() -> list[dict[str, str]]:
    return [check_row(row, f"hub dataset {HUB_ID!r}, row {number}")
            for number, row in enumerate(hub_rows(HUB_ID, None, "test", RELATIVE_PATH), start=1)]


class HumanEvalTask(BaseTask):
    """HumanEval pass@1 with sandboxed grading (see the module docstring)."""

    name = "humaneval"

    def __init__(self, data_dir: str | Path | None = None, timeout: float = 5.0, memory_mb: int = 512,
                 workers: int = 2, num_problems: int | None = None, sandbox: str | None = None):
        """``sandbox``: the isolation mode (``sandbox.ISOLATION_MODES``); None picks bubblewrap, else
        unshare, and raises ``SandboxUnavailableError`` (install bubblewrap) when neither works here.
        ``"rlimits"`` (no isolation) only by name, for code you trust."""
        if num_problems is not None and num_problems < 1:
            raise ValueError(f"num_problems must be >= 1, got {num_problems}")
        if sandbox is not None and sandbox not in ISOLATION_MODES:
            raise ValueError(f"sandbox must be one of {ISOLATION_MODES} or None (the best that works), got {sandbox!r}")
        if sandbox is not None and not isolation_works(sandbox):
            raise SandboxUnavailableError(f"sandbox={sandbox!r} does not work on this machine; install bubblewrap "
                                          "(apt-get install bubblewrap) and pass sandbox=None")
        self.isolation = sandbox or available_isolation()  # fail now, not as wrong grades later
        self.data_dir, self.timeout, self.memory_mb, self.workers = data_dir, timeout, memory_mb, workers
        self.num_problems = num_problems
        self.prompts = PROMPTS
        self._problems: list[Problem] | None = None
        self._grades: dict[tuple[str, str], bool] = {}

    def problems(self, split: str) -> Sequence[Problem]:
        if split not in SPLITS:
            raise unknown_split("humaneval", SPLITS, split)
        if self._problems is None:
            path = resolve_data_file(self.data_dir, RELATIVE_PATH, HUB_ID)
            rows = load_rows(path) if path is not None else _hub_rows()
            self._problems = [self._problem(row) for row in rows]
        return self._problems[: self.num_problems] if self.num_problems else self._problems

    @staticmethod
    def _problem(row: dict[str, str]) -> Problem:
        metadata = {key: row[key] for key in ("entry_point", "test", "canonical_solution")}
        return Problem(id=row["task_id"], question=row["prompt"],
                       answer=normalize_code(row["prompt"] + row["canonical_solution"]), metadata=metadata)

    # -------------------------------------------------------------------- answers and grading
    def extract_answer(self, text: str, problem: Problem | None = None) -> str | None:
        try:
            return extract_program(text, problem)
        except Exception:  # never raise on odd model output
            return None

    @staticmethod
    def _key(problem: Problem, answer: str) -> tuple[str, str]:
        return problem.id, hashlib.sha256(answer.encode("utf-8", errors="surrogatepass")).hexdigest()

    def grade(self, problem: Problem, answer: str | None) -> bool:
        """pass@1 of ``answer``; False for no answer, non-text and text that is not valid Unicode."""
        if not is_text(answer) or not answer.strip():  # is_text: a lone surrogate cannot be written out to run
            return False
        return self.grade_many([(problem, answer)])[0]

    def grade_many(self, items: Sequence[tuple[Problem, str]], timeout: float | None = None) -> list[bool]:
        """Grade many (problem, answer) pairs, running the uncached ones in parallel."""
        todo = {self._key(p, a): build_program(p, a) for p, a in items if self._key(p, a) not in self._grades}
        if todo:
            results = run_many(list(todo.values()), workers=self.workers, timeout=timeout or self.timeout,
                               memory_mb=self.memory_mb, isolation=self.isolation)
            self._grades.update((key, result.passed) for key, result in zip(todo, results))
        return [self._grades[self._key(p, a)] for p, a in items]

    # -------------------------------------------------------------------- simulated backend
    def distractors(self, problem: Problem, rng: random.Random, count: int = 3, batch: int = 3) -> list[str]:
        """Up to ``count`` mutants of the gold program that fail the tests without timing out."""
        candidates = mutants(problem.answer, problem.metadata["entry_point"], rng)
        found: list[str] = []
        for start in range(0, min(len(candidates), 4 * batch), batch):
            chunk = candidates[start : start + batch]
            results = run_many([build_program(problem, c) for c in chunk], workers=self.workers,
                               timeout=min(self.timeout, 1.0), memory_mb=self.memory_mb, isolation=self.isolation)
            for candidate, result in zip(chunk, results):
                if not result.passed and not result.timed_out:
                    self._grades[self._key(problem, candidate)] = False
                    found.append(candidate)
            if len(found) >= count:
                break
        if not found and candidates and not self.grade(problem, candidates[-1]):
            found.append(candidates[-1])  # 'return None' when every other mutant survived or hung
        return found[:count]

    def render_solution(self, problem: Problem, answer: str | None, rng: random.Random) -> str:
        if answer is None:
            return rng.choice((
                "I could not work out a correct implementation for this function.",
                "I am unsure how to implement this; I will not give an answer this time.",
            ))
        intro = rng.choice(("Here is my implementation:", "The complete function:", "Solution:"))
        outro = rng.choice(("", "\n\nIt follows the docstring and its examples.", "\n\nThis handles the edge cases."))
        return f"{intro}\n\n```python\n{answer}\n```{outro}"

"""Tables of realistic LLM outputs: what each task family extracts, and whether it grades right.

Each row: (response text, gold answer as stored in the data, expected extraction, expected grade).
"""

from __future__ import annotations

import pytest

from deliberation_env.tasks.base import Problem
from deliberation_env.tasks.competition import AIME24Task
from deliberation_env.tasks.gsm8k import GSM8KTask
from deliberation_env.tasks.latex import normalize_latex
from deliberation_env.tasks.math500 import MathTask
from deliberation_env.tasks.mmlu import MMLUTask, format_question
from deliberation_env.tasks.numeric import normalize_number

NUMERIC = [
    ("Janet sells 16 - 3 - 4 = 9 eggs.\nShe makes 9 * 2 = $18.\nThe answer is 18.", "18", "18", True),
    ("She makes 9 * 2 = <<9*2=18>>18 dollars.\n#### 18", "18", "18", True),
    ("The answer is $18.", "18", "18", True),
    ("So the house cost $1,080 in total.\nThe answer is $1,080.", "1,080", "1080", True),
    ("**Answer:** 42", "42", "42", True),
    ("Final Answer: The final answer is 204. I hope it is correct.", "204", "204", True),
    ("Adding the times gives 3.4 hours.\nTherefore, the final answer is $\\boxed{204}$.", "204", "204", True),
    ("so $m+n = \\boxed{025}$", "025", "25", True),
    ("So the answer is 27.0", "27.0", "27", True),
    ("The answer is 12.50 dollars.", "12.5", "12.5", True),
    ("The answer is 75%.", "75", "75", True),
    ("The temperature dropped, so the answer is -3.", "-3", "-3", True),
    ("The answer is 3/4", "0.75", "0.75", True),
    ("$$\\boxed{\\frac{3}{4}}$$", "0.75", "0.75", True),
    ("The answer is 5 apples because 2 + 3 = 5 and none were eaten.", "5", "5", True),
    ("The answer is 10 - 4 = 6.", "6", "6", True),
    ("answer: 1,234,567", "1234567", "1234567", True),
    ("The answer is 17.", "18", "17", False),
    ("At first I got 20, but rechecking, the answer is 21", "20", "21", False),
    ("I cannot determine the answer.", "3", None, False),
    ("", "3", None, False),
    ("The total is 5 + 7 = 12 cookies.", "12", "12", True),
    ("The answer is \\$ 2,000", "2000", "2000", True),
    ("Answer: 0.5", "0.5", "0.5", True),
    ("$\\boxed{1{,}000}$", "1000", "1000", True),
    ("The length is \\boxed{36 \\text{ inches}}.", "36", "36", True),
    ("**The answer is 32**", "32", "32", True),
    ("The final answer is: 7\n\nExplanation: there are 3 + 4 items in the box.", "7", "7", True),
    ("We get 8 boxes.\n#### 8", "8", "8", True),
    ("x = 14\nThe answer is x = 14.", "14", "14", True),
    ("The answer is \u22125", "-5", "-5", True),
    ("The answer is twelve.", "12", None, False),
    ("The ratio is one third, so the answer is 1/3", "1/3", "1/3", True),
    ("The answer is +7", "7", "7", True),
    ("She has 3 bags with 4 apples each. The answer is 12 apples. Each bag costs $2.", "12", "12", True),
    ("The answer is 1,000,000.", "1000000", "1000000", True),
    ("The answer is 0.", "0", "0", True),
    ("Step 1: 48/2 = 24\nStep 2: 48 + 24 = 72", "72", "72", True),
    ("#### Step 1: eggs left\n16 - 3 - 4 = 9\n#### Step 2: money\n9 * 2 = 18\nThe answer is 18.", "18", "18", True),
]

MATH = [
    ("So the probability is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}", "\\frac{1}{2}", True),
    ("$\\boxed{\\dfrac{1}{2}}$", "\\frac{1}{2}", "\\frac{1}{2}", True),
    ("The answer is $\\boxed{0.5}$.", "\\frac{1}{2}", "0.5", True),
    ("$\\boxed{\\frac12}$", "\\frac{1}{2}", "\\frac{1}{2}", True),
    ("The distance is $\\boxed{3\\sqrt{13}}$.", "3\\sqrt{13}", "3\\sqrt{13}", True),
    ("The distance is $\\boxed{\\sqrt{117}}$.", "3\\sqrt{13}", "\\sqrt{117}", True),
    ("The domain is $\\boxed{(2, \\infty)}$.", "(2,\\infty)", "(2,\\infty)", True),
    ("$\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$", "\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True),
    ("The angle is $\\boxed{90^\\circ}$.", "90", "90", True),
    ("The angle is $\\boxed{90}$ degrees.", "90^\\circ", "90", True),
    ("The fastest student is $\\boxed{\\text{Evelyn}}$.", "\\text{Evelyn}", "Evelyn", True),
    ("Final Answer: The final answer is $\\frac{3}{56}$. I hope it is correct.", "\\frac{3}{56}", "\\frac{3}{56}", True),
    ("Expanding, $\\boxed{x^2+2x+1}$.", "(x+1)^2", "x^2+2x+1", True),
    ("The roots are $\\boxed{1 \\pm \\sqrt{19}}$.", "1 \\pm \\sqrt{19}", "1\\pm\\sqrt{19}", True),
    ("So $z = \\boxed{6+9i}$.", "6+9i", "6+9i", True),
    ("$\\boxed{\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}}$",
     "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}", True),
    ("The primes are $\\boxed{3, 5, 7}$.", "3, 5, 7", "3,5,7", True),
    ("It costs $\\boxed{\\$36}$.", "\\$36", "36", True),
    ("Hence $\\boxed{k = 5}$.", "5", "5", True),
    ("$\\boxed{\\frac{1}{3}}$", "\\frac{1}{2}", "\\frac{1}{3}", False),
    ("The point is $\\boxed{(1,2)}$.", "(2,1)", "(1,2)", False),
    ("There are $\\boxed{4}$ solutions.", "5", "4", False),
    ("I could not solve this problem.", "5", None, False),
    ("$\\boxed{}$", "5", None, False),
    ("The answer is $\\boxed{\\frac{1}{2}", "\\frac{1}{2}", None, False),
    ("First I got $\\boxed{3}$, but correcting the sign: $\\boxed{4}$.", "4", "4", True),
    ("Answer: $\\sqrt{2}/2$", "\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", True),
    ("The correct choice is $\\boxed{\\text{(C)}}$.", "\\text{(C)}", "(C)", True),
    ("The increase is $\\boxed{10\\%}$.", "10", "10", True),
    ("Each costs $\\boxed{5.4 \\text{ cents}}$.", "5.4 \\text{ cents}", "5.4", True),
    ("The area is $\\boxed{864 \\mbox{ inches}^2}$.", "864 \\mbox{ inches}^2", "864", True),
    ("The answer is $-\\sqrt{3}$.", "-\\sqrt{3}", "-\\sqrt{3}", True),
    ("$\\boxed{\\pi}$", "2\\pi", "\\pi", False),
    ("The line is $\\boxed{y = -2x}$.", "y = -2x", "y=-2x", True),
    ("$\\boxed{\\frac{270}7\\text{ degrees}}$", "\\frac{270}7\\text{ degrees}", "\\frac{270}{7}", True),
    ("So $\\boxed{.35625}$", ".35625", "0.35625", True),
    ("Therefore the answer is $\\boxed{\\frac{\\sqrt{3}}{2}}$, since...", "\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}", True),
    ("The set is $\\boxed{(-\\infty, 2) \\cup (3, \\infty)}$", "(-\\infty, 2) \\cup (3, \\infty)",
     "(-\\infty,2)\\cup(3,\\infty)", True),
]

CHOICES = ["mitochondria", "nucleus", "ribosome", "Golgi apparatus"]
MULTIPLE_CHOICE = [
    ("(B)", "B", "B", True),
    ("B)", "B", "B", True),
    ("**B**", "B", "B", True),
    ("The answer is B", "B", "B", True),
    ("Answer: B", "B", "B", True),
    ("$\\boxed{B}$", "B", "B", True),
    ("Proteins are made by ribosomes. The answer is (C).", "C", "C", True),
    ("Answer: **D**", "D", "D", True),
    ("The correct option is A.", "A", "A", True),
    ("Let me think... ribosomes make proteins.\nThe answer is (C) ribosome.", "C", "C", True),
    ("After eliminating (A) and (B), the correct choice is (D).", "D", "D", True),
    ("I think (A) is wrong and (C) is right:\n(C)", "C", "C", True),
    ("Ribosomes translate mRNA.\nC. ribosome", "C", "C", True),
    ("The answer is: C) ribosome", "C", "C", True),
    ("\\boxed{\\text{D}}", "D", "D", True),
    ("\\boxed{(A)}", "A", "A", True),
    ("ribosome", "C", "C", True),
    ("\\boxed{nucleus}", "B", "B", True),
    ("Answer: Golgi apparatus", "D", "D", True),
    ("I don't know.", "A", None, False),
    ("", "A", None, False),
    ("The answer is E", "A", None, False),
    ("A careful analysis shows mitochondria produce ATP, so the answer is A.", "A", "A", True),
    ("Answer: (B) nucleus", "B", "B", True),
    ("My final answer: option C", "C", "C", True),
    ("**Final Answer: B**", "B", "B", True),
    ("Between A and B, I'd pick B.\nThe answer is B.", "B", "B", True),
    ("The answer is (B), not (C).", "B", "B", True),
    ("Options A and C are wrong. I choose D", "D", "D", True),
    ("The answer is (A).", "C", "A", False),
    ("Answer: D", "B", "D", False),
    ("A. mitochondria\nB. nucleus\nSo it is C.", "C", "C", True),
    ("None of the options seem right to me.", "B", None, False),
    ("The correct answer is **(D) Golgi apparatus**.", "D", "D", True),
]


def _numeric_problem(gold: str) -> Problem:
    return Problem(id="p", question="q", answer=normalize_number(gold) or gold)


def test_tables_are_large_enough():
    assert len(NUMERIC) >= 30 and len(MATH) >= 30 and len(MULTIPLE_CHOICE) >= 30


@pytest.mark.parametrize("task", [GSM8KTask(), AIME24Task()], ids=["gsm8k", "aime24"])
@pytest.mark.parametrize(("text", "gold", "expected", "correct"), NUMERIC)
def test_numeric_outputs(task, text, gold, expected, correct):
    assert task.extract_answer(text) == expected
    assert task.grade(_numeric_problem(gold), task.extract_answer(text)) is correct


@pytest.mark.parametrize(("text", "gold", "expected", "correct"), MATH)
def test_math_outputs(text, gold, expected, correct):
    task = MathTask()
    problem = Problem(id="p", question="q", answer=normalize_latex(gold))
    assert task.extract_answer(text) == expected
    assert task.grade(problem, task.extract_answer(text)) is correct


@pytest.mark.parametrize(("text", "gold", "expected", "correct"), MULTIPLE_CHOICE)
def test_multiple_choice_outputs(text, gold, expected, correct):
    task = MMLUTask()
    problem = Problem(id="p", question=format_question("Where are proteins made?", CHOICES), answer=gold,
                      metadata={"choices": CHOICES, "subject": "biology"})
    assert task.extract_answer(text, problem) == expected
    assert task.grade(problem, task.extract_answer(text, problem)) is correct


def test_multiple_choice_text_needs_the_problem():
    task = MMLUTask()
    assert task.extract_answer("ribosome") is None  # without the choices a choice text is not a letter
    problem = Problem(id="p", question="q", answer="C", metadata={"choices": CHOICES})
    assert task.grade(problem, "ribosome") and not task.grade(problem, "nucleus")


@pytest.mark.parametrize("raw", ["18", "18.0", "$18", "18 dollars", "$18.00", "The answer is 18."])
def test_numeric_grade_accepts_unnormalised_answers(raw):
    assert GSM8KTask().grade(_numeric_problem("18"), raw)
    assert not GSM8KTask().grade(_numeric_problem("19"), raw)

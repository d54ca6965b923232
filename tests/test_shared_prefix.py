"""The prefill-sharing plan of the transformers backend: who shares which prefix, and what it saves."""

from __future__ import annotations

from deliberation_env.backends.shared_prefix import plan_shared_prefixes


def test_identical_prompts_share_all_but_their_last_token():
    prompts = [[1, 2, 3, 4]] * 4 + [[9, 8, 7, 6, 5]] * 2
    plan = plan_shared_prefixes(prompts)
    assert plan.groups == (0, 0, 0, 0, 1, 1) or plan.groups == (1, 1, 1, 1, 0, 0)
    assert plan.prefix_lengths == (3, 3, 3, 3, 4, 4) and plan.tail_width == 1
    assert plan.tokens_prefilled() == 2 * 4 + 6 * 1  # against 6 * 5 for one left-padded block


def test_each_episode_shares_its_problem_not_the_system_prompt_of_all():
    system, tails = [1, 2, 3], [[40], [41, 42], [43]]
    problems = [[10 + k] * 20 for k in range(4)]
    prompts = [system + problem + tail for problem in problems for tail in tails]
    plan = plan_shared_prefixes(prompts)
    assert len(plan.representatives) == 4  # one group per problem, not one group of the 3-token system prompt
    assert set(plan.prefix_lengths) == {23} and plan.tail_width == 2
    assert plan.tokens_prefilled() < 0.5 * len(prompts) * max(map(len, prompts))


def test_adapters_never_share_and_unrelated_prompts_get_no_plan():
    prompts = [[1, 2, 3, 4, 5, 6]] * 2
    assert plan_shared_prefixes(prompts, ["agent_0", "agent_1"]) is None
    assert plan_shared_prefixes(prompts, ["agent_0", "agent_0"]).groups == (0, 0)
    assert plan_shared_prefixes([[1, 2, 3], [4, 5, 6], [7, 8]]) is None
    assert plan_shared_prefixes([[1, 2, 3]]) is None
    # sharing two tokens of long prompts saves less than the threshold: not worth a second forward pass
    assert plan_shared_prefixes([[1, 2] + [3] * 30, [1, 2] + [4] * 30]) is None


def test_a_lone_row_splits_its_prompt_instead_of_widening_every_tail():
    prompts = [[1] * 30 + [2], [1] * 30 + [3], [7, 7, 7], [9] * 40]
    plan = plan_shared_prefixes(prompts)
    assert plan.prefix_lengths[:2] == (30, 30) and plan.tail_width == 3  # the pair's tails
    assert plan.groups[2] is None and plan.prefix_lengths[2] == 0  # fits in the tail block whole
    assert plan.prefix_lengths[3] == 37 and plan.groups[3] not in (None, plan.groups[0])  # its own first 37 tokens
    assert len(plan.representatives) == 2 and plan.prefix_width == 37
    assert plan.tokens_prefilled() == 2 * 37 + 4 * 3  # against 4 * 40 in one block

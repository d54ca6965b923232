"""Advantage maths of SoftRankPO, GRPO and MAGRPO."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtri

from baselines.advantages import average_ranks, group_normalized, grouped_apply, softrank_advantages

RNG = np.random.default_rng(0)
GROUPS = [RNG.normal(size=k) for k in (2, 3, 8, 16)] + [RNG.integers(-2, 3, size=8).astype(float) for _ in range(6)]


@pytest.mark.parametrize("returns", GROUPS)
@pytest.mark.parametrize(("a", "b"), [(10.0, 0.0), (0.1, 0.0), (3.7, -5.2), (1e-3, 1e3)])
def test_softrank_invariant_to_positive_affine_maps(returns, a, b):
    np.testing.assert_array_equal(softrank_advantages(returns), softrank_advantages(a * returns + b))


@pytest.mark.parametrize("returns", GROUPS)
def test_softrank_zero_mean_and_bounded(returns):
    adv = softrank_advantages(returns, tau=0.8)
    assert abs(adv.mean()) < 1e-12
    assert np.abs(adv).max() <= 2 * abs(ndtri(0.5 / len(returns))) / 0.8 + 1e-12


def test_softrank_untied_values_are_normal_quantiles():
    adv = softrank_advantages(np.array([3.0, 1.0, 2.0, 0.0]), tau=1.0)
    expected = ndtri((np.array([4, 2, 3, 1]) - 0.5) / 4)
    np.testing.assert_allclose(adv, expected, atol=1e-12)
    assert adv.argmax() == 0 and adv.argmin() == 3


def test_softrank_ties_get_equal_advantages_and_average_ranks():
    returns = np.array([1.0, 0.0, 1.0, 2.0, 0.0, 1.0])
    np.testing.assert_array_equal(average_ranks(returns), [4, 1.5, 4, 6, 1.5, 4])
    adv = softrank_advantages(returns)
    assert adv[0] == adv[2] == adv[5] and adv[1] == adv[4]
    assert adv[3] > adv[0] > adv[1]


def test_float_noise_from_rescaling_does_not_split_ties():
    exact = np.array([0.3, 0.3, 1.0, 0.0])
    noisy = np.array([0.1 + 0.2, 0.3, 1.0, 0.0])  # 0.30000000000000004 vs 0.3
    np.testing.assert_array_equal(softrank_advantages(exact), softrank_advantages(noisy))


@pytest.mark.parametrize("value", [0.0, 1.0, -7.5])
def test_all_equal_group_gives_zero(value):
    np.testing.assert_array_equal(softrank_advantages(np.full(8, value)), np.zeros(8))
    np.testing.assert_array_equal(group_normalized(np.full(8, value)), np.zeros(8))


def test_tau_scales_contrast():
    returns = RNG.normal(size=8)
    sharp, soft = softrank_advantages(returns, 0.4), softrank_advantages(returns, 5.0)
    np.testing.assert_allclose(sharp * 0.4, soft * 5.0, atol=1e-12)
    assert np.abs(sharp).max() > np.abs(softrank_advantages(returns, 0.8)).max() > np.abs(soft).max()
    with pytest.raises(ValueError):
        softrank_advantages(returns, 0.0)


def test_grpo_and_magrpo_advantages():
    returns = np.array([1.0, 2.0, 3.0, 6.0])
    np.testing.assert_allclose(group_normalized(returns, std_normalize=False), [-2, -1, 0, 3])
    normed = group_normalized(returns)
    assert abs(normed.mean()) < 1e-12 and abs(normed.std() - 1) < 1e-5
    # without the std division, advantages scale with the rewards (what SoftRankPO avoids)
    np.testing.assert_allclose(group_normalized(10 * returns, std_normalize=False), 10 * np.array([-2, -1, 0, 3]))


def test_grouped_apply_uses_one_value_per_episode():
    # key 0: episodes 0 (3 rows) and 1 (1 row); key 1: episodes 2 and 3 (one row each)
    values = np.array([1.0, 1.0, 1.0, 0.0, 5.0, 9.0])
    keys = np.array([0, 0, 0, 0, 1, 1])
    units = np.array([0, 0, 0, 1, 2, 3])
    out = grouped_apply(values, keys, units, lambda r: r - r.mean())
    np.testing.assert_allclose(out, [0.5, 0.5, 0.5, -0.5, -2.0, 2.0])


def test_gradient_norms_are_clipped_per_agent():
    """One agent's large gradient does not shrink another agent's step (one optimizer group per agent)."""
    import torch

    from baselines.llm.train_llm import clip_per_group

    small, large = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.SGD([{"params": [small]}, {"params": [large]}], lr=1.0)
    small.grad, large.grad = torch.tensor([0.3, 0.0, 0.4]), torch.full((4,), 50.0)
    norms = clip_per_group(optimizer, max_norm=1.0)
    assert norms == pytest.approx([0.5, 100.0])
    assert small.grad.tolist() == pytest.approx([0.3, 0.0, 0.4])  # under the limit: untouched
    assert float(large.grad.norm()) == pytest.approx(1.0, rel=1e-4)

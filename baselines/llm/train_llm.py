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
   same functions as the meta-policy trainers (``baselines.advantages``).
4. Loss: ``baselines.llm.policy.token_loss`` on the trained agents' completions (token-level, ratio clipping
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
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from baselines.advantages import group_normalized, grouped_apply, softrank_advantages
from baselines.config import add_config_arguments, config_from_args
from baselines.llm.config import ALGOS, LLMTrainConfig, make_text_env
from baselines.llm.evaluation import evaluate_team, meta_env, plot_reward_curves, save_comparison
from deliberation_env.cli import ArgumentParser, KeyValueAction, report_user_errors, user_input

PROG = "python -m baselines.train_llm"


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

    from baselines.llm.policy import token_loss

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

    from baselines.llm.policy import LoraSettings, TeamPolicy, team_backends
    from baselines.logger import MetricsLogger, progress_bar
    from baselines.runtime import seed_everything

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
            meta_env(cfg, None, check_problems=True)
        os.makedirs(cfg.out, exist_ok=True)
    return train(cfg)


if __name__ == "__main__":
    main()

"""Fine-tune the LLM agents themselves on the text env with MAGRPO, GRPO or SoftRankPO (docs/train_llm.md).

    python -m baselines.llm.train_llm --algo magrpo --model smollm2 --task arithmetic --task-option levels=0 \\
        --agents 2 --group-size 4 --updates 20 --lora --train-agents 0,1 --alternate 0 --out runs/llm

Each update, top to bottom:

1. Rollouts (``baselines.llm.rollout``): one tree per problem (``problems_per_update``, train split). At every
   node (a text-env state) each acting agent samples G = ``group_size`` completions; ``--joint align`` pairs
   candidate g of every agent (G children per node), ``--joint cross`` takes every combination; each joint action
   steps its own fork of the state. Generation goes through the ``Backend`` protocol (the in-process model; with
   per-agent LoRA adapters, every agent's requests share batches); the samples keep the sampled token ids.
2. Credit: a joint action's return-to-go is its step's team reward (or, with ``--credit agent``, each agent's own)
   plus ``gamma`` times the mean return of its child's joint actions; a candidate's return is its joint action's
   (the mean over the joint actions it is in, crossed).
3. Advantages per group, the G candidates of one (node, agent), or of every agent at the node with
   ``--pool-agents``: ``--advantage`` mean (MAGRPO), rloo, max or raw, divided by the std for GRPO, or
   SoftRankPO rank quantiles; the functions of the meta-policy trainers (``baselines.advantages``).
4. Loss: ``baselines.llm.policy.token_loss`` on the trained agents' completions (token-level, ratio clipping
   against the sampling-time log-probabilities, optional KL to the initial model), ``epochs`` optimizer steps,
   each accumulating micro-batches of ``micro_batch`` completions.

Then the checkpoint (``<out>/checkpoint``, ``team.json``) and, unless ``--no-evaluate``, the team's accuracy and
tokens on held-out test problems before and after, in the meta-action env with the checkpoint's backends.

Operations (docs/train_llm.md): ``--eval-every`` (best team in ``<out>/best``), ``--save-every``/``--resume``
(``baselines.llm.checkpoint``), ``--warmup-updates``/``--lr-schedule``; under ``accelerate launch`` each process
plays its share of every update's problems and the gradients are summed over processes (``baselines.llm.parallel``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from baselines.llm.config import LLMTrainConfig, make_text_env
from baselines.llm.evaluation import evaluate_team, meta_env, report
from baselines.llm.rollout import Sample, advantages, check_planned_tree, collect
from deliberation_env.cli import (
    ArgumentParser,
    add_config_arguments,
    config_from_args,
    report_user_errors,
    user_input,
)

PROG = "python -m baselines.llm.train_llm"


# ----------------------------------------------------------------------------- the update
def policy_update(team: Any, optimizer: Any, samples: Sequence[Sample], adv: np.ndarray, cfg: LLMTrainConfig,
                  backward: Any = None, step: bool = True, parallel: Any = None) -> dict[str, float]:
    """``cfg.epochs`` optimizer steps of ``token_loss`` over the batch, accumulating micro-batches of each agent's
    completions. The first pass stores each sample's log-probabilities as the sampling-time ones (the sampler is
    the same weights); with ``step=False`` only the loss is computed (no gradients, nothing changes).
    ``parallel`` (``baselines.llm.parallel.DataParallel``, several processes): the normalisers count every
    process's completions, the gradients are summed over the processes before clipping, the stats are the batch's.
    ``entropy``: the mean entropy (nats) of the trained positions' temperature-scaled next-token distributions, from
    the first pass's logits."""
    import torch

    from baselines.llm.parallel import DataParallel
    from baselines.llm.policy import row_normalizers, token_loss
    from baselines.llm.remote import tis_advantages

    parallel = parallel or DataParallel()
    backward = backward or (lambda loss: loss.backward())
    lengths = [len(s.completion_ids) for s in samples]
    batch_tokens, batch_completions = parallel.sum([sum(lengths), len(samples)])
    normalizers = row_normalizers(lengths, cfg.loss_norm, batch_tokens, batch_completions, cfg.completion_tokens())
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
    keys = ("loss", "pg_loss", "kl", "clip_frac", "entropy_sum", "entropy_tokens")
    sums = dict.fromkeys(keys, 0.0)
    grad_norms: list[list[float]] = []  # per optimizer step, per agent's parameter group
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    passes = cfg.epochs if step else 1
    team.train(step)
    for epoch in range(passes):
        if step:
            optimizer.zero_grad(set_to_none=True)
        for agent, rows in chunks:
            with torch.set_grad_enabled(step):
                log_p, mask, entropy = team.logprobs(agent, *_inputs(samples, rows), entropy=True)
                if samples[rows[0]].old_log_p is None:
                    for row, values in zip(rows, log_p.detach().cpu()):
                        samples[row].old_log_p = values
                width = log_p.shape[1]
                old = torch.stack([samples[r].old_log_p[:width] for r in rows]).to(log_p.device)
                ref = torch.stack([samples[r].ref_log_p[:width] for r in rows]).to(log_p.device) if cfg.kl_coef > 0 else None
                advantage = tis_advantages(torch.tensor(adv[rows], dtype=log_p.dtype, device=log_p.device), old,
                                           [None if samples[r].sampler_is_policy else samples[r].sampler_log_p
                                            for r in rows], cfg.tis_cap)  # a server's samples: importance weights
                loss, info = token_loss(log_p, old, ref, advantage, mask, cfg.clip, cfg.kl_coef, normalizers[rows],
                                        cfg.clip_high)
            if step:
                backward(loss)
            for key, value in {**info, "loss": float(loss.detach())}.items():
                sums[key] += value / passes
            if epoch == 0:
                sums["entropy_sum"] += float(entropy.sum())
                sums["entropy_tokens"] += float(mask.sum())
        if step:
            parallel.reduce_gradients(parameters)
            grad_norms.append(clip_per_group(optimizer, cfg.max_grad_norm or float("inf")))
            optimizer.step()
    team.train(False)
    totals = dict(zip(keys, parallel.sum([sums[k] for k in keys])))
    result = {k: totals[k] for k in keys[:4]}
    result["entropy"] = totals["entropy_sum"] / max(totals["entropy_tokens"], 1.0)
    result.update({f"grad_norm_{i}": float(np.mean(values)) for i, values in enumerate(zip(*grad_norms))})
    return result


def clip_per_group(optimizer: Any, max_norm: float) -> list[float]:
    """Clip each parameter group's gradient norm on its own (one group per agent: one agent's large gradient does
    not shrink another's step); the norms before clipping, per group (``max_norm=inf``: only the norms)."""
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
    """AdamW with one parameter group per agent (its own learning rate), or one group for shared weights; ValueError
    when a trainable parameter is not float32 (AdamW would update it without a float32 master copy)."""
    import torch

    rates = cfg.learning_rates()
    groups = team.parameter_groups()
    low = sorted({str(p.dtype).removeprefix("torch.") for params in groups for p in params if p.dtype != torch.float32})
    if low:
        raise ValueError(f"trainable parameters in {', '.join(low)}: AdamW keeps no float32 master copy, so an update "
                         "smaller than half a rounding step of its weight is lost; train LoRA adapters (--weights "
                         "lora: peft keeps them in float32) or load the weights with --dtype float32")
    return torch.optim.AdamW([{"params": params, "lr": rates[i] if len(groups) > 1 else cfg.lr}
                              for i, params in enumerate(groups)], lr=cfg.lr, weight_decay=0.0)


def lr_factor(update: int, cfg: LLMTrainConfig) -> float:
    """The learning-rate multiplier of update ``update`` (from 0): a linear warmup over ``warmup_updates``, then
    ``lr_schedule`` from 1 towards 0 at ``updates``."""
    if update < cfg.warmup_updates:
        return (update + 1) / (cfg.warmup_updates + 1)
    done = min(1.0, (update - cfg.warmup_updates) / max(1, cfg.updates - cfg.warmup_updates))
    return {"constant": 1.0, "linear": 1.0 - done, "cosine": 0.5 * (1.0 + math.cos(math.pi * done))}[cfg.lr_schedule]


def make_scheduler(optimizer: Any, cfg: LLMTrainConfig) -> Any:
    """Every parameter group's rate (per-agent rates included) times ``lr_factor``; stepped once per update."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: lr_factor(update, cfg))


def trained_now(cfg: LLMTrainConfig, update: int) -> list[int]:
    """The agents trained at ``update``: all of train_agents, or one at a time with ``alternate``."""
    agents = cfg.agents_trained()
    return [agents[(update // cfg.alternate) % len(agents)]] if cfg.alternate else agents


def update_metrics(shards: Sequence[tuple[list, list, Any, dict]], epochs: int) -> dict[str, float]:
    """The batch's metrics from every process's (records, (prompt, completion) lengths, advantages, advantage
    stats): accuracy, returns, tokens, the reward terms (per-agent episode means) and the advantage stats (means
    over the processes)."""
    records = [r for shard in shards for r in shard[0]]
    lengths = [n for shard in shards for n in shard[1]]
    adv = np.concatenate([np.asarray(shard[2], dtype=float).reshape(-1) for shard in shards])
    flags = [r["correct"] for r in records if r["correct"] is not None]
    metrics = {"accuracy": float(np.mean(flags)) if flags else float("nan"),
               "team_return": float(np.mean([r["rewards"].sum() for r in records])),
               "tokens": float(np.mean([r["tokens"] for r in records])),
               "completion_tokens": float(np.mean([c for _, c in lengths])) if lengths else 0.0,
               "adv_abs": float(np.abs(adv).mean()) if len(adv) else 0.0,
               "generated_tokens": float(sum(r["tokens"] for r in records)),
               "trained_tokens": float(sum(p + c for p, c in lengths) * epochs)}
    for key in sorted({k for r in records for k in r["terms"]}):
        metrics[key] = float(np.mean([r["terms"].get(key, 0.0) for r in records]))
    for key in sorted({k for shard in shards for k in shard[3]}):
        metrics[key] = float(np.mean([shard[3][key] for shard in shards if key in shard[3]]))
    return metrics


# ----------------------------------------------------------------------------- the run
def make_team(cfg: LLMTrainConfig, device: str | None = None, devices: Sequence[str] | None = None) -> Any:
    """The untrained ``TeamPolicy`` that ``cfg`` trains (LoRA adapters start as the identity)."""
    from baselines.llm.policy import LoraSettings, TeamPolicy

    targets = tuple(t.strip() for t in cfg.lora_targets.split(",") if t.strip()) or None
    return TeamPolicy(cfg.model, cfg.num_agents, cfg.weights, LoraSettings(cfg.lora_rank, cfg.lora_alpha, targets=targets),
                      dtype=cfg.dtype, device=device or cfg.device, batch_size=cfg.generate_batch,
                      converted_cache_dir=cfg.converted_cache_dir, reference=cfg.kl_coef > 0, devices=devices)


def train(cfg: LLMTrainConfig, team: Any = None) -> Any:
    """Train (module docstring); returns the ``TeamPolicy``. The main process writes ``cfg.out``; under
    ``accelerate launch`` every process plays its share of each update's problems (``baselines.llm.parallel``)."""
    import torch

    from baselines.llm.checkpoint import Progress, load_state, save_state
    from baselines.llm.parallel import DataParallel, make_accelerator
    from baselines.llm.remote import RemoteGeneration
    from baselines.logger import progress_bar
    from baselines.runtime import seed_everything

    cfg.validate()
    accelerator = make_accelerator(cfg.device)
    parallel = DataParallel(accelerator)
    devices = cfg.devices_of_agents()
    seed_everything(cfg.seed + parallel.rank, cfg.threads)  # rank 0 draws as a single process does
    if team is None:
        team = make_team(cfg, str(accelerator.device), devices)
    parallel.broadcast_parameters([p for group in team.parameter_groups() for p in group])
    optimizer = make_optimizer(team, cfg)
    scheduler = make_scheduler(optimizer, cfg)
    problems = parallel.share(cfg.problems_per_update)  # this process's problems of every update
    envs = [make_text_env(cfg) for _ in problems]  # each problem's tree root (rollouts fork it)
    rng = np.random.default_rng(cfg.seed)  # the same problem seeds in every process
    remote = RemoteGeneration(cfg, team, parallel) if cfg.generate_url else None  # --generate-url: sample on servers
    progress = load_state(cfg.resume, team, optimizer, scheduler, rng, parallel, cfg.out) if cfg.resume else Progress()
    if cfg.evaluate and not cfg.resume and parallel.is_main:  # a resumed run keeps the saved row (if any)
        progress.evaluations.append(evaluate_team("before", team.samplers, cfg))
    logger = open_logger(cfg, progress) if parallel.is_main else None
    bar = progress_bar(cfg.updates, f"train_llm {cfg.algo}", cfg.progress and parallel.is_main)
    bar.update(progress.update)
    began = time.time()
    for update in range(progress.update, cfg.updates):
        if parallel.any(cfg.max_minutes > 0 and time.time() - began > 60 * cfg.max_minutes):
            if parallel.is_main:
                print(f"train_llm: stopping after {update} updates, the {cfg.max_minutes:g}-minute budget is spent",
                      file=sys.stderr)
            break
        start = time.time()
        trained = trained_now(cfg, update)
        seeds = rng.integers(0, 2**31 - 1, size=cfg.problems_per_update)[problems.start : problems.stop]
        with torch.inference_mode():
            samples, tree = collect(envs, team, seeds, update, trained, cfg, remote.samplers if remote else None)
        rollout_seconds = time.time() - start
        samples, adv, adv_stats = advantages(samples, tree, cfg)
        rates = [group["lr"] for group in optimizer.param_groups]
        stats = policy_update(team, optimizer, samples, adv, cfg, accelerator.backward, parallel=parallel)
        scheduler.step()
        update_seconds = time.time() - start - rollout_seconds
        if remote is not None:  # the trained adapters onto the servers; how far their log-probabilities were from ours
            stats.update(remote.after_update(team, trained, samples))
        metrics = log_row(cfg, parallel, tree, samples, (adv, adv_stats), stats,
                          {"trained_agents": ",".join(map(str, trained)), "seconds": time.time() - start,
                           "rollout_seconds": rollout_seconds, "update_seconds": update_seconds}, rates)
        if cfg.eval_every and (update + 1) % cfg.eval_every == 0:
            if parallel.is_main:
                metrics.update(evaluate_and_keep_best(cfg, team, update + 1, progress))
            parallel.barrier()
        if logger is not None:
            logger.log(update + 1, metrics)
        progress.update = update + 1
        if cfg.save_every and progress.update % cfg.save_every == 0:
            save_state(cfg.out, team, optimizer, scheduler, rng, progress, parallel, asdict(cfg))
        bar.update(1)
        bar.set_postfix(acc=metrics["accuracy"], ret=metrics["team_return"], loss=stats.get("loss", 0.0))
    bar.close()
    if remote is not None:
        remote.close()
    if cfg.save_every and progress.update % cfg.save_every:  # the last update, or where the time budget stopped
        save_state(cfg.out, team, optimizer, scheduler, rng, progress, parallel, asdict(cfg))
    if logger is not None:
        logger.close()
        save_and_report(cfg, team, progress, time.time() - began, str(accelerator.device), devices)
    parallel.barrier()
    return team


def open_logger(cfg: LLMTrainConfig, progress: Any) -> Any:
    """The main process's ``MetricsLogger``; a resumed run's metrics.jsonl starts with the rows logged before."""
    from baselines.logger import MetricsLogger

    logger = MetricsLogger(cfg.out, cfg.tensorboard)
    for row in progress.rows:
        logger.log(row["step"], {k: v for k, v in row.items() if k != "step"})
    progress.rows = logger.rows
    return logger


def log_row(cfg: LLMTrainConfig, parallel: Any, tree: Any, samples: Sequence[Any], scored: tuple[Any, dict],
            stats: dict[str, Any], timing: dict[str, Any], rates: Sequence[float]) -> dict[str, Any]:
    """One update's log row (numbers, and ``trained_agents`` as text) over every process: the batch's metrics
    (``update_metrics``), the tree's generated tokens, ``timing``, the learning rates, the generation and training
    speeds and the update's ``stats``."""
    adv, adv_stats = scored  # the advantages and their stats
    metrics: dict[str, Any] = update_metrics(
        parallel.gather((tree.records, [(len(s.prompt_ids), len(s.completion_ids)) for s in samples], adv,
                         adv_stats)), cfg.epochs)
    metrics["generated_tokens"] = parallel.sum([tree.generated_tokens])[0]  # the tree's leaves share their prefixes
    metrics.update({**timing, "lr": rates[0],
                    **({f"lr_{i}": rate for i, rate in enumerate(rates)} if len(rates) > 1 else {}),
                    # generation speed (every agent's completion tokens) and training speed (prompt + completion
                    # tokens through forward and backward, per epoch), over all processes
                    "rollout_tok_s": metrics["generated_tokens"] / max(timing["rollout_seconds"], 1e-9),
                    "update_tok_s": metrics["trained_tokens"] / max(timing["update_seconds"], 1e-9), **stats})
    return metrics


def evaluate_and_keep_best(cfg: LLMTrainConfig, team: Any, updates: int, progress: Any) -> dict[str, Any]:
    """Evaluate the team after ``updates`` updates; save it as the best when its accuracy is the highest so far.
    Returns the row's ``eval_*`` metrics."""
    from baselines.llm.checkpoint import save_best

    row = evaluate_team(f"update {updates}", team.samplers, cfg)
    if progress.best is None or row["accuracy"] > progress.best["accuracy"]:
        progress.best = {**row, "update": updates}
        save_best(cfg.out, team, row, updates, cfg.save_merged)
    return {f"eval_{k}": row[k] for k in ("accuracy", "accuracy_low", "accuracy_high", "tokens")}


def save_and_report(cfg: LLMTrainConfig, team: Any, progress: Any, training_seconds: float, device: str,
                    devices: Any) -> None:
    """The main process's end of a run: the final checkpoint, the report, one line on stdout."""
    checkpoint = os.path.join(cfg.out, "checkpoint")
    team.save(checkpoint, merged=cfg.save_merged)
    report(cfg, progress, checkpoint, dict(dtype=cfg.dtype, device=device, batch_size=cfg.generate_batch,
                                           devices=devices))
    print(f"trained {cfg.algo} for {progress.update} updates ({len(progress.rows)} logged) in "
          f"{training_seconds:.0f}s of training -> {checkpoint}")


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, LLMTrainConfig)
    parser.add_argument("--lora", dest="weights", action="store_const", const="lora", help="same as --weights lora")
    return parser


@report_user_errors(PROG)
def main(argv: Sequence[str] | None = None) -> Any:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    cfg = config_from_args(LLMTrainConfig, args)
    with user_input():
        cfg.validate()
        env = make_text_env(cfg)  # an unknown task, a bad task/env option or reward name fails here, in one line
        env.reset(seed=cfg.seed)
        check_planned_tree(env, cfg)  # so does a rollout tree over --max-tree-nodes, before the model loads
        if cfg.evaluate or cfg.eval_every:
            meta_env(cfg, None, check_problems=True)
        os.makedirs(cfg.out, exist_ok=True)
    return train(cfg)


if __name__ == "__main__":
    main()

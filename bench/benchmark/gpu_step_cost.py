"""The GPU time and memory of the parts of ``bench/studies/llm_study.py --preset gpu`` that run in the trainer, measured on
random weights of the model's architecture (nothing to download: the cost of a forward or backward pass does not
depend on the weights' values).

    python bench/benchmark/gpu_step_cost.py                       # Qwen2.5-1.5B's shapes, the preset's batch
    python bench/benchmark/gpu_step_cost.py --updates 3 --generate-batches 2

1. One update's loss pass, through the trainer's own ``policy_update``: ``--sequences`` completions of
   ``--completion`` tokens after ``--prompt`` prompt tokens, split between the agents, in micro-batches of
   ``--micro-batch``, LoRA (rank 8, q/v, one adapter per agent) on a bfloat16 base, one AdamW step. The preset's
   update has 8 problems x 40 completions = 320; the prompt and completion lengths are guesses of the averages.
2. The in-process evaluation's generation: ``--generate-batch`` rows of ``--prompt`` prompt tokens, ``--new``
   sampled tokens each (no early stop: the worst case of a 256-token budget), with ``model.generate`` as
   ``TransformersBackend`` calls it.

Not measured here: the rollouts' sampling on the vLLM server and the adapter sync. Peak memory is the trainer's
(torch's allocator), not the server's. Saves bench/results/gpu_step_cost.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from bench.common.results import save_markdown
from deliberation_env.cli import OLD_TEAM_FLAGS, ArgumentParser, add_env_arguments

ARCHITECTURES = {
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
                     "tie_word_embeddings": True},
    "tiny": {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True},
}
"""The shapes of Hugging Face configs, so that no download is needed (tiny: a check of the script itself)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", choices=ARCHITECTURES, default="qwen2.5-1.5b")
    add_env_arguments(parser, ("num_agents",), defaults={"num_agents": 2}, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--sequences", type=int, default=320, help="completions per update")
    parser.add_argument("--prompt", type=int, default=300, help="prompt tokens per completion")
    parser.add_argument("--completion", type=int, default=150, help="completion tokens per completion")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--updates", type=int, default=3, help="timed updates (after one warm-up)")
    parser.add_argument("--generate-batch", type=int, default=64)
    parser.add_argument("--new", type=int, default=256, help="generated tokens per row")
    parser.add_argument("--generate-batches", type=int, default=2, help="timed generate calls (after one warm-up)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script with --architecture tiny")
    parser.add_argument("--stem", default="gpu_step_cost")
    return parser.parse_args(argv)


def random_team(args: argparse.Namespace):
    """A ``TeamPolicy`` (LoRA, one adapter per agent) around a random-weight bfloat16 model on the GPU."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from baselines.llm.policy import LoraSettings, TeamPolicy, adapter_name

    shapes = dict(ARCHITECTURES[args.architecture])
    config = AutoConfig.for_model(shapes.pop("model_type"), **shapes)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(model, lora, adapter_name=adapter_name(0))
    for agent in range(1, args.num_agents):
        model.add_adapter(adapter_name(agent), lora)
    team = TeamPolicy.__new__(TeamPolicy)  # the policy's methods over this model, without loading a checkpoint
    backend = SimpleNamespace(model=model, pad_id=0, settings=SimpleNamespace(device=torch.device(args.device)))
    team.num_agents, team.weights, team.lora, team.references = args.num_agents, "lora", LoraSettings(), []
    team.backends = [backend] * args.num_agents
    for group in team.parameter_groups():
        for parameter in group:
            parameter.requires_grad_(True)
    return team, config.vocab_size


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def peak_gib(device: str) -> float:
    """Torch's peak allocation on the GPU since the last reset (NaN on the CPU)."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")


def reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def time_updates(args: argparse.Namespace, team, vocab: int) -> tuple[float, float]:
    """(seconds per update, peak GiB) of ``policy_update`` over random token ids of the configured lengths."""
    import numpy as np

    from baselines.llm.config import LLMTrainConfig
    from baselines.llm.rollout import Sample
    from baselines.llm.train_llm import make_optimizer, policy_update

    cfg = LLMTrainConfig(num_agents=args.num_agents, micro_batch=args.micro_batch, max_tokens=args.completion)
    optimizer = make_optimizer(team, cfg)
    rng = np.random.default_rng(0)
    times = []
    reset_peak(args.device)
    for update in range(args.updates + 1):
        samples = [Sample(i % args.num_agents, 0, 0, rng.integers(1, vocab, args.prompt).tolist(),
                          rng.integers(1, vocab, args.completion).tolist(), 0.7) for i in range(args.sequences)]
        advantages = rng.standard_normal(args.sequences)
        synchronize(args.device)
        start = time.perf_counter()
        policy_update(team, optimizer, samples, advantages, cfg)
        synchronize(args.device)
        if update:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return float(np.mean(times)), peak_gib(args.device)


def time_generation(args: argparse.Namespace, team, vocab: int) -> tuple[float, float]:
    """(seconds per generate call, peak GiB) of ``--generate-batch`` rows, ``--new`` sampled tokens each."""
    import torch

    model = team.backends[0].model
    model.eval()
    ids = torch.randint(1, vocab, (args.generate_batch, args.prompt), device=args.device)
    times = []
    reset_peak(args.device)
    with torch.inference_mode():
        for call in range(args.generate_batches + 1):
            synchronize(args.device)
            start = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.7,
                           max_new_tokens=args.new, min_new_tokens=args.new, pad_token_id=0)
            synchronize(args.device)
            if call:
                times.append(time.perf_counter() - start)
    return sum(times) / len(times), peak_gib(args.device)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_step_cost.py: no CUDA device here; it measures the GPU preset's costs on a GPU "
                         "(--device cpu --architecture tiny checks the script)")
    team, vocab = random_team(args)
    update_seconds, update_peak = time_updates(args, team, vocab)
    generate_seconds, generate_peak = time_generation(args, team, vocab)
    tokens = args.sequences * (args.prompt + args.completion)
    rows = [
        "| part | shape | seconds (mean) | peak GiB (trainer) |", "|---|---|---|---|",
        f"| loss pass + AdamW step (policy_update) | {args.sequences} x ({args.prompt} + {args.completion}) tokens = "
        f"{tokens:,}, micro-batch {args.micro_batch}, {args.updates} updates | {update_seconds:.1f} | {update_peak:.1f} |",
        f"| generate (evaluation) | {args.generate_batch} rows x {args.prompt} prompt + {args.new} new tokens, "
        f"{args.generate_batches} calls | {generate_seconds:.1f} | {generate_peak:.1f} |",
    ]
    header = (f"GPU cost of the trainer's parts of train_llm --preset gpu, {args.architecture} shapes with random "
              f"weights (bfloat16 base, LoRA r=8 q/v x {args.num_agents} agents), "
              + (torch.cuda.get_device_name() if args.device == "cuda" else "CPU"))
    save_markdown(args.stem, header, "\n".join(rows))


if __name__ == "__main__":
    main()

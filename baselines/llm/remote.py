"""Sampling on OpenAI-compatible servers while ``baselines.llm.train_llm`` trains in-process (``--generate-url``).

The servers (vLLM, SGLang) serve the frozen base with one LoRA adapter per agent, loaded under the agent's name
``agent_i``; the trainer holds the same adapters and updates them. Per update:

1. ``ServerSampler`` sends agent i's requests with ``model="agent_i"``, asking for every generated token's
   log-probability and, from vLLM, the token ids (``return_tokens_as_token_ids``). The samples keep the sampled ids
   and the sampler's log-probabilities (``Sample.sampler_log_p``, ``baselines.llm.rollout.sampled_tokens``).
2. The loss weighs each token's clipped surrogate by a truncated importance weight (TIS),
   ``w_t = min(exp(old_t - s_t), C)`` (``tis_weights``), where ``old_t`` is the trainer's log-probability at the
   sampling weights and ``s_t`` the server's: the server's numerics (bf16, other kernels) differ from the trainer's,
   so its samples are slightly off-policy. ``C`` is ``--tis-cap`` (0: no weights).
3. After the optimizer step, ``AdapterSync`` saves each trained agent's adapter to ``<sync_dir>/agent_i-<version>``
   (a folder the servers can read: a shared filesystem) and reloads it on every server:

       POST <url>/unload_lora_adapter {"lora_name": "agent_i"}            (not loaded yet: fine)
       POST <url>/load_lora_adapter   {"lora_name": "agent_i", "lora_path": "<server path>/agent_i-<version>"}

   vLLM refuses a load under a name that is loaded (unless ``load_inplace``, newer versions only), hence the unload
   first; each load gets a new internal id, so the server reads the new weights. Every agent is synced once before the
   first rollout (the servers may hold other adapters under these names). SGLang serves the same two routes at the
   root (``/load_lora_adapter``), tried when ``/v1/...`` does not exist.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from baselines.llm.policy import adapter_name
from deliberation_env.cli import UserError
from deliberation_env.requests import Completion, Request

if TYPE_CHECKING:  # httpx (the openai extra) is imported where the servers are used, not by the loss's tis_advantages
    import httpx

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
_NOT_LOADED = re.compile(r"cannot be found|not (been )?(found|loaded)|does not exist|no such|unknown", re.IGNORECASE)


class AdapterSyncError(UserError):
    """A server refused (or could not be reached for) a LoRA adapter update: its setup is wrong (one-line CLI error)."""


def setup_hint(rank: int) -> str:
    """How to start a server whose adapters the trainer can update."""
    return (f"start vLLM with {RUNTIME_LORA_ENV}=True in its environment and --enable-lora --max-lora-rank {rank} "
            f"(at least --lora-rank), e.g. {RUNTIME_LORA_ENV}=True vllm serve BASE --enable-lora --max-lora-rank "
            f"{rank} --logprobs-mode processed_logprobs (SGLang: --enable-lora --max-lora-rank {rank} "
            "--lora-target-modules ...); see docs/train_llm.md")


def check_config(cfg: Any) -> None:
    """ValueError when ``--generate-url`` cannot work with the other settings."""
    for url in cfg.generate_url:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--generate-url {url!r} must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1)")
    if cfg.generate_url and cfg.weights != "lora":
        raise ValueError(f"--generate-url samples with the servers' LoRA adapters, which the trainer updates after "
                         f"each step: use it with --weights lora (got --weights {cfg.weights})")


# ----------------------------------------------------------------------------- sampling
class ServerSampler:
    """The whole team's generator on the servers (the ``Backend`` protocol): agent i's requests name its adapter as
    the model and ask for every token's log-probability and id. Requests that asked for ``token_logprobs`` get them
    back as (text, log-probability) pairs, the texts decoded with ``tokenizer``."""

    def __init__(self, urls: Sequence[str], num_agents: int, tokenizer: Any, eos_ids: Sequence[int],
                 **backend_kwargs: Any):
        from deliberation_env.backends.openai import OpenAICompatibleBackend

        names = [adapter_name(i) for i in range(num_agents)]
        self.backend = OpenAICompatibleBackend(list(urls), model=names[0], agent_models=names, token_ids=True,
                                               **backend_kwargs)
        self.tokenizer, self.eos_ids = tokenizer, list(eos_ids)

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        completions = self.backend.generate([replace(r, token_logprobs=True) for r in requests])
        return [self._as_asked(r, c) for r, c in zip(requests, completions)]

    def identity(self) -> str:
        return f"{self.backend.identity()},adapters=per-agent"

    def close(self) -> None:
        self.backend.close()

    def _as_asked(self, request: Request, completion: Completion) -> Completion:
        if not request.token_logprobs:
            return replace(completion, token_logprobs=None)
        if completion.token_ids is None or completion.token_id_logprobs is None:
            return completion
        pairs = tuple((self.tokenizer.decode([i]), value) for i, value in
                      zip(completion.token_ids, completion.token_id_logprobs) if i not in self.eos_ids)
        return replace(completion, token_logprobs=pairs)


# ----------------------------------------------------------------------------- truncated importance weights
def tis_weights(old_log_p: torch.Tensor, sampler_log_p: torch.Tensor, cap: float) -> torch.Tensor:
    """min(exp(old - sampler), cap) per token, without gradients; 1 where the sampler's log-probability is NaN
    (unknown) and everywhere with ``cap=0`` (off)."""
    with torch.no_grad():
        if cap <= 0:
            return torch.ones_like(old_log_p)
        known = ~torch.isnan(sampler_log_p)
        gap = (old_log_p - torch.nan_to_num(sampler_log_p)).clamp(max=math.log(cap))
        return torch.where(known, torch.exp(gap), torch.ones_like(gap))


def tis_advantages(advantages: torch.Tensor, old_log_p: torch.Tensor, sampler_log_ps: Sequence[Any],
                   cap: float) -> torch.Tensor:
    """Per-token advantages A * w_t (rows x tokens) for ``token_loss`` (w_t > 0, so min(r A w, clip(r) A w) is
    w times the clipped surrogate), or ``advantages`` unchanged when no row has the sampler's log-probabilities."""
    if cap <= 0 or all(s is None for s in sampler_log_ps):
        return advantages
    width = old_log_p.shape[1]
    sampler = torch.full_like(old_log_p, math.nan)
    for row, values in enumerate(sampler_log_ps):
        if values is not None:
            values = torch.as_tensor(values, dtype=old_log_p.dtype)[:width]
            sampler[row, : len(values)] = values.to(old_log_p.device)
    return advantages[:, None] * tis_weights(old_log_p, sampler, cap)


def mismatch_stats(samples: Sequence[Any], cap: float) -> dict[str, float]:
    """The share of trained tokens that had the sampler's log-probability (``sampler_token_frac``) and, with importance
    weights on (``cap`` > 0: the loss's old log-probabilities are then the trainer's at the sampling weights), how far
    the sampler's were from them: mean (old - sampler), mean |old - sampler|, the mean TIS weight and the share of
    tokens capped."""
    gaps, total, known = [], 0, 0
    for sample in samples:
        total += len(sample.completion_ids)
        if sample.sampler_log_p is None:
            continue
        sampler = torch.as_tensor(sample.sampler_log_p, dtype=torch.float32)
        known += int((~torch.isnan(sampler)).sum())
        if cap > 0 and sample.old_log_p is not None:
            n = min(len(sampler), len(sample.completion_ids))
            gap = sample.old_log_p[:n].float() - sampler[:n]
            gaps.append(gap[~torch.isnan(gap)])
    stats = {"sampler_token_frac": known / max(total, 1)}
    gap = torch.cat(gaps) if gaps else torch.zeros(0)
    if len(gap):
        stats.update(sampler_logp_gap=float(gap.mean()), sampler_logp_abs_gap=float(gap.abs().mean()),
                     tis_weight_mean=float(torch.exp(gap.clamp(max=math.log(cap))).mean()),
                     tis_capped_frac=float((gap > math.log(cap)).float().mean()))
    return stats


# ----------------------------------------------------------------------------- adapter sync
def save_adapter(peft_model: Any, name: str, target: Path) -> Path:
    """Save one named adapter of a peft model to ``target`` (atomically: a staging folder beside it, then renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        peft_model.save_pretrained(str(staging), selected_adapters=[name], save_embedding_layers=False)
        saved = staging / name if (staging / name / "adapter_config.json").is_file() else staging  # peft: a subfolder
        os.replace(saved, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


class AdapterSync:
    """Puts the trainer's adapters on the servers (module docstring, step 3). ``folder``: where the trainer writes
    them; ``server_folder``: the same folder as the servers see it (another mount point; default ``folder``)."""

    def __init__(self, urls: Sequence[str], folder: str | os.PathLike[str], server_folder: str = "",
                 rank: int = 8, timeout: float = 300.0, api_key_env: str = "OPENAI_API_KEY"):
        import httpx

        self.urls = [u.rstrip("/") for u in urls]
        self.folder = Path(folder).resolve()
        self.server_folder = server_folder or str(self.folder)
        self.rank, self.version = rank, 0
        self.current: dict[str, Path] = {}
        self._routes: dict[str, str] = {}  # url -> the prefix its adapter routes answered on
        key = os.environ.get(api_key_env, "")
        self._client = httpx.Client(timeout=timeout, headers={"Authorization": f"Bearer {key}"} if key else {})

    def sync(self, team: Any, agents: Sequence[int]) -> float:
        """Save ``agents``' adapters and reload them on every server; returns the seconds it took."""
        start = time.monotonic()
        self.version += 1
        peft_model = team.backends[0].model
        saved = {adapter_name(a): save_adapter(peft_model, adapter_name(a), self.folder / f"{adapter_name(a)}-{self.version:05d}")
                 for a in agents}
        for url in self.urls:
            for name, path in saved.items():
                self.reload(url, name, f"{self.server_folder.rstrip('/')}/{path.name}")
        for name, path in saved.items():  # the servers hold the new versions: the old folders can go
            previous = self.current.get(name)
            if previous is not None and previous != path:
                shutil.rmtree(previous, ignore_errors=True)
            self.current[name] = path
        return time.monotonic() - start

    def reload(self, url: str, name: str, path: str) -> None:
        """Unload ``name`` on the server at ``url`` (when loaded), then load the adapter at ``path`` under it."""
        response = self._post(url, "unload_lora_adapter", {"lora_name": name})
        if response.status_code >= 400 and not (response.status_code in (400, 404) and name in response.text
                                                and _NOT_LOADED.search(response.text)):
            raise self._refused(url, "unload", name, response)
        response = self._post(url, "load_lora_adapter", {"lora_name": name, "lora_path": path})
        if response.status_code >= 400:
            raise self._refused(url, "load", name, response, path)

    def close(self) -> None:
        self._client.close()

    def _post(self, url: str, route: str, body: dict[str, Any]) -> httpx.Response:
        """POST to the route on ``url`` (vLLM: under /v1) or, when that route does not exist, at the server's root
        (SGLang); the prefix that answered is kept for the next calls."""
        import httpx

        root = url[: -len("/v1")] if url.endswith("/v1") else url
        prefixes = [self._routes[url]] if url in self._routes else list(dict.fromkeys([url, root]))
        response: httpx.Response | None = None
        for prefix in prefixes:
            try:
                response = self._client.post(f"{prefix}/{route}", json=body)
            except httpx.HTTPError as error:
                raise AdapterSyncError(f"{url}: cannot reach the server to {route.split('_')[0]} LoRA adapter "
                                       f"{body['lora_name']!r} ({type(error).__name__}: {error}); check that it runs, "
                                       f"and {setup_hint(self.rank)}") from None
            if not _route_missing(response):
                self._routes[url] = prefix
                return response
        assert response is not None
        return response

    def _refused(self, url: str, action: str, name: str, response: httpx.Response, path: str = "") -> AdapterSyncError:
        body = " ".join(response.text[:300].split())
        if _route_missing(response):
            return AdapterSyncError(
                f"{url}: the server has no runtime LoRA endpoints (HTTP {response.status_code} on POST "
                f"{url}/{action}_lora_adapter{' and at the root' if url.endswith('/v1') else ''}): vLLM adds them only "
                f"when {RUNTIME_LORA_ENV}=True is in its environment; {setup_hint(self.rank)}")
        if re.search(r"not enabled|enable[-_]lora", body, re.IGNORECASE):
            cause = "LoRA is not enabled on the server (start it with --enable-lora)"
        elif re.search(r"rank", body, re.IGNORECASE):
            cause = f"the adapter's rank {self.rank} is above the server's --max-lora-rank (raise it)"
        elif re.search(r"no adapter found|not found|no such file|does not exist", body, re.IGNORECASE) and path:
            cause = (f"the server cannot read {path!r}: --sync-dir must be a folder the server sees (a shared "
                     "filesystem), at the path --sync-server-dir names when it is mounted elsewhere")
        else:
            cause = "see its answer"
        return AdapterSyncError(f"{url}: the server refused to {action} LoRA adapter {name!r} (HTTP "
                                f"{response.status_code}: {body}): {cause}; {setup_hint(self.rank)}")


def _route_missing(response: httpx.Response) -> bool:
    """A 404/405 of the web framework (the route does not exist), not of the adapter API."""
    if response.status_code not in (404, 405):
        return False
    try:
        data = response.json()
    except ValueError:
        return True
    return isinstance(data, dict) and data.get("detail") in ("Not Found", "Method Not Allowed")


# ----------------------------------------------------------------------------- the trainer's side
class RemoteGeneration:
    """What ``train()`` needs for ``--generate-url``: the per-agent ``samplers``, and the sync after each update.
    Every agent is synced at once (the servers start from the trainer's weights). With several processes
    (``parallel``, a ``baselines.llm.parallel.DataParallel``) the main one syncs and the others wait for it."""

    def __init__(self, cfg: Any, team: Any, parallel: Any = None):
        backend = team.backends[0]
        self.sampler = ServerSampler(cfg.generate_url, team.num_agents, team.tokenizer, backend.eos_ids,
                                     concurrency=64)
        self.samplers = [self.sampler] * team.num_agents
        self.tis_cap, self.parallel = cfg.tis_cap, parallel
        self.adapters = None
        if parallel is None or parallel.is_main:
            folder = cfg.sync_dir or os.path.join(cfg.out, "server_adapters")
            self.adapters = AdapterSync(cfg.generate_url, folder, cfg.sync_server_dir, rank=cfg.lora_rank)
        self._sync(team, range(team.num_agents))

    def after_update(self, team: Any, trained: Sequence[int], samples: Sequence[Any]) -> dict[str, float]:
        """Reload the trained agents' adapters on the servers; metrics: the seconds it took and how far the servers'
        log-probabilities were from the trainer's (``mismatch_stats``, this process's samples)."""
        return {"sync_seconds": self._sync(team, trained), **mismatch_stats(samples, self.tis_cap)}

    def close(self) -> None:
        self.sampler.close()
        if self.adapters is not None:
            self.adapters.close()

    def _sync(self, team: Any, agents: Sequence[int]) -> float:
        seconds = self.adapters.sync(team, agents) if self.adapters is not None else 0.0
        if self.parallel is not None:
            self.parallel.barrier()
        return seconds

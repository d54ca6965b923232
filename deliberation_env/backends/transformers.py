"""A local Hugging Face ``transformers`` backend: any model directory or GGUF file.

Batched generation with left padding: requests are sorted by prompt length and decoded ``batch_size`` rows at a
time. Rows of a batch whose prompts start alike (and use one
adapter) share the prefill of that prefix: the N agents' prompts of an episode share the chat template and the
problem, a GRPO group's G samples share the whole prompt, and each is computed once, its KV cache copied to the
rows (``share_prefill``; the layout is in ``shared_prefix``). Each request keeps its own sampling
settings and its own random stream: the sampling is a per-row Gumbel-max draw
(``argmax(logits / T + Gumbel noise)``, after a per-row top-p cut) whose noise comes from a
``torch.Generator`` seeded with that request's seed, so a row's draws do not depend on which
other requests share its batch. Temperature 0 is greedy decoding. A row leaves the batch (and its KV cache) once it
has ended, and waiting requests take its place, instead of rows being fed pad tokens until the batch's longest row
ends (``drop_finished``; the loop is in ``decode``). Every completion carries its sampled ``token_ids`` (the stop
token included) and, for requests that ask for ``token_logprobs``, each id's log-probability under the sampling
distribution (``token_id_logprobs``): a trainer scores exactly what was sampled.

Reproducibility: the same requests in the same batches give the same text, token for token,
so a seeded episode (or a seeded set of batched episodes) replays exactly. Putting a request in
a *different* batch can change float rounding (other padding, other matmul shapes) and, rarely,
flip a near-tie between two tokens; use ``CachedBackend`` when replays must be exact
across different batchings.

GGUF files are dequantised at load time (about 15-25 s for a small model on a CPU). With
``converted_cache_dir`` the dense weights are saved there once, under a key made of the file's
name, size, modification time and the dtype, and later loads read them in well under a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deliberation_env.backends.decode import (
    SeededSampler,
    cache_keyword,
    can_decode,
    decode,
    first_token_top,
    forward_parameters,
    positions_from_mask,
)
from deliberation_env.backends.shared_prefix import PrefixPlan, plan_shared_prefixes
from deliberation_env.requests import Completion, Request
from deliberation_env.settings import settings_attributes, settings_from

log = logging.getLogger(__name__)

DTYPES: dict[str, Any] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "auto": "auto",
}


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with ``count`` torch threads (None: unchanged), then restore the previous count: a backend's
    generation and a trainer's small networks each keep their own setting in one process."""
    previous = torch.get_num_threads()
    if count is None or count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass
class TransformersSettings:
    """How a ``TransformersBackend`` loads and runs its model: every field is a keyword of its constructor."""

    dtype: str = "bfloat16"
    """The weights' dtype: bfloat16 (fastest on most CPUs), float16, float32 or auto."""
    device: str = "cpu"
    """The torch device the model runs on."""
    batch_size: int = 16
    """Rows per generate batch."""
    converted_cache_dir: str | os.PathLike[str] | None = None
    """Where to keep the dequantised weights of a GGUF file between runs (None: convert at every load)."""
    top_logprobs: int = 20
    """How many first-token log-probabilities critic requests return."""
    num_threads: int | None = None
    """torch threads for loading and generating (None: torch's count when the backend is built); each call sets them
    and restores the caller's count, so that a trainer's one thread for its small networks neither slows generation
    nor is changed by it."""
    trust_remote_code: bool = False
    """Let ``transformers`` run a model repository's own code."""
    share_prefill: bool = True
    """Prefill a prompt prefix that several rows of a batch share only once (the module docstring; False gives every
    row its own prefill)."""
    drop_finished: bool = True
    """Decode with ``decode.decode``, which takes a row out of the batch once it has ended and lets waiting requests
    in (False, or a model whose forward takes no KV cache or position ids, uses ``transformers``' ``generate`` on
    batches of one ``max_tokens``)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("batch_size", "top_logprobs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@settings_attributes(TransformersSettings)
class TransformersBackend:
    """Generates locally with a ``transformers`` causal LM (see the module docstring)."""

    def __init__(self, model: str | os.PathLike[str], gguf_file: str | os.PathLike[str] | None = None,
                 settings: TransformersSettings | None = None, **keywords: Any):
        """``model``: a local model directory (or hub id), a ``.gguf`` file path, or a PEFT adapter folder
        (``adapter_config.json``; its base, a path relative to the folder or a hub id, is loaded and the adapter
        merged in: the base-plus-adapter checkpoints of ``baselines.llm.train_llm``; needs ``peft``). ``gguf_file``: a
        GGUF file name inside ``model`` (or a full path). ``settings=`` (a ``TransformersSettings``) or its fields as
        keywords (``dtype="float32"``, ``batch_size=8``, ...); ``backend.batch_size`` and the like read and write
        ``backend.settings``."""
        self.settings = settings_from(TransformersSettings, settings, keywords, "TransformersBackend")
        if self.settings.num_threads is None:
            self.settings.num_threads = torch.get_num_threads()
        self.source, self.gguf_file = _resolve_source(model, gguf_file)
        self.loaded_from = ""
        with torch_threads(self.settings.num_threads):
            self.tokenizer, self.model = self._load()
        self.model.to(self.settings.device).eval()
        _contiguous_head_inputs(self.model)
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.generate_calls = 0
        self.batches = 0
        self.prefix_tokens_reused = 0  # prompt tokens taken from another row's prefill instead of computed
        self.decoded_rows = 0  # rows decoded, summed over forward passes (generate's finished rows count): the work

    # ------------------------------------------------------------------ loading
    def _load(self) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = DTYPES[self.settings.dtype]
        common = {"trust_remote_code": self.settings.trust_remote_code}
        if self.gguf_file is None and (Path(self.source) / "adapter_config.json").is_file():
            return self._load_adapter(Path(self.source), dtype, common)
        if self.gguf_file is None:
            self.loaded_from = str(self.source)
            tokenizer = AutoTokenizer.from_pretrained(self.source, **common)
            model = AutoModelForCausalLM.from_pretrained(self.source, dtype=dtype, **common)
            return _prepare_tokenizer(tokenizer), model
        converted = self._converted_dir()
        if converted is not None and (converted / "converted.json").is_file():
            self.loaded_from = str(converted)
            tokenizer = AutoTokenizer.from_pretrained(converted, **common)
            model = AutoModelForCausalLM.from_pretrained(converted, dtype=dtype, **common)
            return _prepare_tokenizer(tokenizer), model
        self.loaded_from = str(Path(self.source) / self.gguf_file)
        kwargs: dict[str, Any] = {"gguf_file": self.gguf_file, **common}
        tokenizer = AutoTokenizer.from_pretrained(self.source, **kwargs)
        try:
            from transformers import GgufConfig

            kwargs["quantization_config"] = GgufConfig(dequantize=True)  # dense weights: fast, saveable
        except ImportError:  # older transformers always dequantise GGUF
            pass
        model = AutoModelForCausalLM.from_pretrained(self.source, dtype=dtype, **kwargs)
        if converted is not None:
            self._save_converted(tokenizer, model, converted)
        return _prepare_tokenizer(tokenizer), model

    def _load_adapter(self, folder: Path, dtype: Any, common: dict[str, Any]):
        """A PEFT adapter folder: its base (``base_model_name_or_path``, a relative path read from the adapter
        folder) with the adapter merged in, so generation runs on a plain model."""
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"]
        if not Path(base).is_absolute() and (folder / base).is_dir():
            base = str((folder / base).resolve())
        self.loaded_from = f"{folder} (adapter on {base})"
        tokenizer = AutoTokenizer.from_pretrained(folder if (folder / "tokenizer_config.json").is_file() else base, **common)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, **common)
        return _prepare_tokenizer(tokenizer), PeftModel.from_pretrained(model, folder).merge_and_unload()

    def _converted_dir(self) -> Path | None:
        cache = self.settings.converted_cache_dir
        if cache is None or self.gguf_file is None:
            return None
        path = Path(self.source) / self.gguf_file
        stat = path.stat()
        key = f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}|{self.settings.dtype}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return Path(cache).expanduser() / f"{path.stem}-{self.settings.dtype}-{digest}"

    def _save_converted(self, tokenizer, model, target: Path) -> None:
        """Save the dense model next to ``target`` and move it into place atomically."""
        if self.gguf_file is None:  # only a GGUF model is converted
            raise RuntimeError("_save_converted: this backend loads no GGUF file")
        source = Path(self.source) / self.gguf_file
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / "converted.json").write_text(json.dumps({"gguf": str(source), "dtype": self.settings.dtype}))
            os.replace(staging, target)
            log.info("saved the dequantised %s to %s", source.name, target)
        except OSError as error:  # another process won the race, or the disk is read-only
            if not (target / "converted.json").is_file():
                log.warning("could not keep the converted model in %s: %s", target, error)
        except ValueError as error:  # e.g. a model that transformers refuses to serialise
            log.warning("could not save the converted model (%s); it will be converted again next time", error)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        configured = getattr(self.model.generation_config, "eos_token_id", None)
        for value in (configured if isinstance(configured, list) else [configured], [self.tokenizer.eos_token_id]):
            ids.extend(int(v) for v in value if v is not None and int(v) not in ids)
        if not ids:
            raise ValueError(f"model {self.source!r} has no end-of-sequence token; cannot stop generation")
        return ids

    # ------------------------------------------------------------------ protocol
    def identity(self) -> str:
        name = Path(self.gguf_file).name if self.gguf_file else Path(str(self.source)).name
        return f"transformers:{name},dtype={self.settings.dtype},top_logprobs={self.settings.top_logprobs}"

    def __repr__(self) -> str:
        return (
            f"TransformersBackend(model={self.identity().split(':', 1)[1].split(',')[0]!r}, dtype={self.settings.dtype!r}, "
            f"device={str(self.settings.device)!r}, batch_size={self.settings.batch_size}, loaded_from={self.loaded_from!r})"
        )

    def close(self) -> None:
        """Nothing to release (the model stays usable); present for symmetry with other backends."""

    def generate(self, requests: Sequence[Request], adapter_names: Sequence[str] | None = None) -> list[Completion]:
        """Answer ``requests``. ``adapter_names`` (a PEFT model with several LoRA adapters): the adapter of each
        request, so that requests of different adapters share batches (peft's mixed-adapter batches)."""
        if adapter_names is not None and len(adapter_names) != len(requests):
            raise ValueError(f"adapter_names has {len(adapter_names)} entries for {len(requests)} requests")
        self.generate_calls += 1
        with torch_threads(self.settings.num_threads):
            return self._answer(requests, adapter_names)

    def _answer(self, requests: Sequence[Request], adapter_names: Sequence[str] | None) -> list[Completion]:
        prompts = [self.encode(request) for request in requests]
        sampler = SeededSampler(requests, torch.device(self.settings.device), record_logprobs=any(r.token_logprobs for r in requests))
        if self.settings.drop_finished and can_decode(self.model):
            decoded = decode(self.model, sampler, [r.max_tokens for r in requests], self.eos_ids,
                             sorted(range(len(requests)), key=lambda i: len(prompts[i])),
                             lambda indices: self._start_rows([prompts[i] for i in indices], _pick(adapter_names, indices)),
                             self.settings.batch_size, adapter_names, [r.logprobs for r in requests], self.settings.top_logprobs)
            generated, first_top = decoded.tokens, decoded.first_top
            self.decoded_rows += decoded.row_steps
        else:
            generated, first_top = self._generate_grouped(requests, prompts, sampler, adapter_names)
        return [self._completion(request, len(prompt), tokens, first_top.get(i), sampler.recorded[i],
                                 sampler.recorded_sampling[i])
                for i, (request, prompt, tokens) in enumerate(zip(requests, prompts, generated))]

    # ------------------------------------------------------------------ internals
    def encode(self, request: Request) -> list[int]:
        """The prompt token ids of a request (its messages through the chat template, generation prompt added)."""
        messages = [m.as_dict() for m in request.messages]
        if self.tokenizer.chat_template:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # a base model without a template: a plain transcript
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _start_rows(self, prompts: Sequence[list[int]], adapter_names: Sequence[str] | None):
        """A batch's layout (input ids, attention mask) and the KV cache of its shared prefixes, if any."""
        self.batches += 1
        plan = plan_shared_prefixes(prompts, adapter_names) if self.settings.share_prefill else None
        input_ids, attention = self._layout(prompts, plan)
        cache = self._prefill_shared(input_ids, attention, plan, adapter_names) if plan is not None else None
        return input_ids, attention, cache

    def _completion(self, request: Request, prompt_tokens: int, tokens: list[int],
                    first_top: tuple[list[float], list[int]] | None, logprobs: list[float],
                    sampling_logprobs: list[float]) -> Completion:
        """The completion of ``tokens`` (the generated ids; ``generate``'s rows go on with padding after a stop). Its
        ``token_ids`` are the sampled ids up to the stop token included; with ``token_logprobs`` asked for, also
        ``token_id_logprobs`` (the sampling distribution's; absent where ``generate`` did not record the last one)."""
        stop = next((k for k, token in enumerate(tokens) if token in self.eos_ids), None)
        kept = tokens if stop is None else tokens[:stop]
        ids = tuple(tokens if stop is None else tokens[: stop + 1])
        sampled = tuple(sampling_logprobs[: len(ids)]) if request.token_logprobs else ()
        return Completion(
            text=self.tokenizer.decode(kept, skip_special_tokens=True),
            prompt_tokens=prompt_tokens,
            completion_tokens=len(tokens) if stop is None else stop + 1,
            top_logprobs=self._top_logprobs(*first_top) if request.logprobs and first_top is not None else None,
            finish_reason="length" if stop is None else "stop",
            token_logprobs=self._token_logprobs(kept, logprobs) if request.token_logprobs else None,
            token_ids=ids,
            token_id_logprobs=sampled if sampled and len(sampled) == len(ids) else None,
        )

    @torch.inference_mode()
    def _generate_grouped(self, requests: Sequence[Request], prompts: Sequence[list[int]], sampler: SeededSampler,
                          adapter_names: Sequence[str] | None) -> tuple[list[list[int]], dict[int, Any]]:
        """``drop_finished=False``: ``transformers``' ``generate`` on batches of one ``max_tokens``, sorted by prompt
        length (each request's tokens, and the top first tokens of those that asked for log-probabilities)."""
        order = sorted(range(len(requests)), key=lambda i: (requests[i].max_tokens, len(prompts[i])))
        generated: list[list[int]] = [[] for _ in requests]
        first_top: dict[int, tuple[list[float], list[int]]] = {}
        start = 0
        while start < len(order):
            max_tokens = requests[order[start]].max_tokens
            end = start
            while end < len(order) and end - start < self.settings.batch_size and requests[order[end]].max_tokens == max_tokens:
                end += 1
            batch = order[start:end]
            names = _pick(adapter_names, batch)
            input_ids, attention, cache = self._start_rows([prompts[i] for i in batch], names)
            tokens, logits = self._generate(input_ids, attention, sampler.subset(batch), max_tokens, cache, names,
                                            any(requests[i].logprobs for i in batch))
            for row, index in enumerate(batch):
                generated[index] = tokens[row]
                if logits is not None and requests[index].logprobs:
                    first_top[index] = first_token_top(logits[row], self.settings.top_logprobs)
            start = end
        return generated, first_top

    def _generate(self, input_ids: torch.Tensor, attention: torch.Tensor, sampler: SeededSampler, max_tokens: int,
                  cache, adapter_names: Sequence[str] | None, want_logprobs: bool):
        """(tokens per row, first-step logits or None) from ``transformers``' ``generate`` (``drop_finished=False``)."""
        from transformers import GenerationConfig, LogitsProcessorList

        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, num_beams=1, pad_token_id=self.pad_id,
                                  eos_token_id=self.eos_ids, return_dict_in_generate=True, output_logits=want_logprobs)
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
            **({cache_keyword(self.model) or "past_key_values": cache} if cache is not None else {}),
            **({"adapter_names": list(adapter_names)} if adapter_names is not None else {}),
        )
        first_logits = output.logits[0].float() if want_logprobs and output.logits else None
        self.decoded_rows += input_ids.shape[0] * (output.sequences.shape[1] - input_ids.shape[1])
        return output.sequences[:, input_ids.shape[1]:].tolist(), first_logits

    def _layout(self, prompts: Sequence[list[int]], plan: PrefixPlan | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask of the batch: one left-padded block, or the plan's two blocks (shared
        prefix, own tail; see ``shared_prefix``)."""
        prefix_width = plan.prefix_width if plan is not None else 0
        width = plan.width if plan is not None else max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            shared = plan.prefix_lengths[row] if plan is not None else 0
            if shared:
                input_ids[row, prefix_width - shared : prefix_width] = torch.tensor(prompt[:shared], dtype=torch.long)
                attention[row, prefix_width - shared : prefix_width] = 1
            input_ids[row, width - len(prompt) + shared :] = torch.tensor(prompt[shared:], dtype=torch.long)
            attention[row, width - len(prompt) + shared :] = 1
        return input_ids.to(self.settings.device), attention.to(self.settings.device)

    def _prefill_shared(self, input_ids: torch.Tensor, attention: torch.Tensor, plan: PrefixPlan,
                        adapter_names: Sequence[str] | None):
        """The KV cache of the prefix block: each shared prefix prefilled once, on its group's representative row,
        and copied to the group's rows (rows outside every group get a copy too, masked out)."""
        from transformers import DynamicCache

        rows, columns = list(plan.representatives), plan.prefix_width
        mask = attention[rows, :columns]
        positions = positions_from_mask(mask)
        cache = DynamicCache(config=self.model.config)
        extra: dict[str, Any] = {"adapter_names": [adapter_names[r] for r in rows]} if adapter_names is not None else {}
        if "logits_to_keep" in forward_parameters(self.model):
            extra["logits_to_keep"] = 1  # only the cache is wanted; skip the vocabulary projection of the prefix
        extra[cache_keyword(self.model) or "past_key_values"] = cache
        self.model(input_ids=input_ids[rows, :columns], attention_mask=mask, position_ids=positions, use_cache=True,
                   **extra)
        slots = [group if group is not None else 0 for group in plan.groups]
        cache.batch_select_indices(torch.tensor(slots, device=input_ids.device))
        self.prefix_tokens_reused += sum(plan.prefix_lengths) - sum(plan.prefix_lengths[r] for r in rows)
        return cache

    def _token_logprobs(self, tokens: list[int], logprobs: list[float]) -> tuple[tuple[str, float], ...]:
        """(text, log-probability) per kept token; decoded one by one, so their texts concatenate to the text."""
        return tuple((self.tokenizer.decode([token]), value) for token, value in zip(tokens, logprobs))

    def _top_logprobs(self, values: list[float], ids: list[int]) -> dict[str, float]:
        """{token text: log-probability}; tokens that decode to the same text are merged."""
        result: dict[str, float] = {}
        for value, token_id in zip(values, ids):
            text = self.tokenizer.decode([token_id])
            result[text] = _logaddexp(result[text], value) if text in result else value
        return result


def _contiguous_head_inputs(model: Any) -> None:
    """Make the output projection's input contiguous. ``generate`` (and ``logits_to_keep``) hand it a slice of the
    hidden states, and torch 2.13's CPU ``linear`` on a non-contiguous bfloat16 batch copies the weight once per
    row: 7.5 s instead of 0.02 s for 16 rows of a 150k-token vocabulary (bench/benchmark/cpu_paths.py measures the effect)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Module):
        head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))


def _pick(values: Sequence[str] | None, indices: Sequence[int]) -> list[str] | None:
    return [values[i] for i in indices] if values is not None else None


def _logaddexp(a: float, b: float) -> float:
    high = max(a, b)
    return high + math.log(math.exp(a - high) + math.exp(b - high))


def _prepare_tokenizer(tokenizer):
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _resolve_source(model: str | os.PathLike[str], gguf_file: str | os.PathLike[str] | None) -> tuple[str, str | None]:
    """(directory or hub id, GGUF file name inside it or None)."""
    path = Path(model).expanduser()
    if gguf_file is None and path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
        return str(path.parent), path.name
    if gguf_file is not None:
        gguf = Path(gguf_file).expanduser()
        if gguf.is_absolute() or (not (path / gguf).is_file() and gguf.is_file()):
            if not gguf.is_file():
                raise FileNotFoundError(f"GGUF file {str(gguf)!r} does not exist")
            return str(gguf.resolve().parent), gguf.name
        if path.is_dir() and not (path / gguf).is_file():
            raise FileNotFoundError(f"GGUF file {gguf.name!r} is not in {str(path)!r}")
        return str(path), str(gguf)
    if path.exists():
        return str(path), None
    if str(model).startswith((".", "/", "~")):
        raise FileNotFoundError(f"model directory {str(path)!r} does not exist")
    return str(model), None  # a hub id (needs network access or a local hub cache)

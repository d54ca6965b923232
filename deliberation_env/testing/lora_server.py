"""A loopback OpenAI-compatible server with vLLM's runtime LoRA endpoints, over a real model (tests).

    with lora_server(TransformersBackend(model, dtype="float32")) as server:    # http://127.0.0.1:<free port>/v1
        httpx.post(f"{server.url}/load_lora_adapter", json={"lora_name": "agent_0", "lora_path": folder})
        OpenAICompatibleBackend(server.url, model="agent_0").generate(requests)   # under that adapter

Routes, as ``vllm serve BASE --enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` answers them:

- ``GET /v1/models``: the base (``served_name``) and every loaded adapter;
- ``POST /v1/chat/completions``: ``model`` is the base or a loaded adapter's name (else HTTP 404); ``logprobs`` gives
  each generated token's log-probability (of the logits divided by the temperature: vLLM's
  ``--logprobs-mode processed_logprobs``), ``top_logprobs`` the most likely tokens at each step, and
  ``return_tokens_as_token_ids`` names tokens ``"token_id:<id>"``. The end-of-sequence token the model stopped at is
  listed too (vLLM lists it; the text leaves it out);
- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path", "load_inplace"}``: a peft adapter folder, loaded with
  peft onto the base under that name (HTTP 400 when the name is loaded and ``load_inplace`` is not true, 404 when the
  folder holds no adapter, 400 when LoRA is off or the rank is above ``max_lora_rank``);
- ``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` (HTTP 404 when it is not loaded).

``runtime_updates=False`` leaves out the two adapter routes (HTTP 404 ``{"detail": "Not Found"}``, as vLLM without
the environment variable), ``enable_lora=False`` refuses every load (as vLLM without ``--enable-lora``). Requests are
answered one at a time (one lock around the model); ``loads``, ``unloads`` and ``bodies`` record what came in.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import torch

from deliberation_env.backends.base import Message
from deliberation_env.requests import Request
from deliberation_env.testing.servers import LoopbackHTTPServer, send_json

BASE = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch


def vllm_error(status: int, message: str, kind: str = "BadRequestError") -> tuple[int, dict[str, Any]]:
    """(status, body) of an error in vLLM's format."""
    return status, {"object": "error", "message": message, "type": kind, "param": None, "code": status}


class LoraServer:
    """See the module docstring. ``backend``: a ``TransformersBackend`` of the base model (its ``model`` becomes a
    ``PeftModel`` once an adapter is loaded)."""

    def __init__(self, backend: Any, *, served_name: str = "base", runtime_updates: bool = True,
                 enable_lora: bool = True, max_lora_rank: int = 64):
        self.backend, self.served_name = backend, served_name
        self.runtime_updates, self.enable_lora, self.max_lora_rank = runtime_updates, enable_lora, max_lora_rank
        self.adapters: dict[str, str] = {}  # name -> path
        self.loads: list[dict[str, Any]] = []
        self.unloads: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self._model_lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                outer._route(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                outer._route(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = LoopbackHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # ------------------------------------------------------------------ routing
    def _route(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = handler.path.split("?")[0].rstrip("/")
        body: dict[str, Any] = {}
        if method == "POST":
            raw = handler.rfile.read(int(handler.headers.get("content-length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                send_json(handler, *vllm_error(400, "the body is not JSON"))
                return
            if not isinstance(body, dict):
                send_json(handler, *vllm_error(400, "the body is not a JSON object"))
                return
        routes = {("GET", "/v1/models"): self._models, ("POST", "/v1/chat/completions"): self._chat}
        if self.runtime_updates:
            routes.update({("POST", "/v1/load_lora_adapter"): self._load,
                           ("POST", "/v1/unload_lora_adapter"): self._unload})
        route = routes.get((method, path))
        if route is None:
            send_json(handler, 404, {"detail": "Not Found"})
            return
        self.bodies.append(body)
        try:
            status, payload = route(body)
        except Exception as error:  # a bug or a bad request the model choked on: an HTTP 500, not a dead thread
            status, payload = vllm_error(500, f"{type(error).__name__}: {error}", "InternalServerError")
        send_json(handler, status, payload)

    def _models(self, _body: dict[str, Any]) -> tuple[int, Any]:
        cards = [{"id": self.served_name, "object": "model", "root": str(self.backend.source), "parent": None}]
        cards += [{"id": name, "object": "model", "root": path, "parent": self.served_name}
                  for name, path in self.adapters.items()]
        return 200, {"object": "list", "data": cards}

    # ------------------------------------------------------------------ adapters
    def _load(self, body: dict[str, Any]) -> tuple[int, Any]:
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if not self.enable_lora:
            return vllm_error(400, "LoRA is not enabled. Use --enable-lora to enable LoRA.")
        if name in self.adapters and not body.get("load_inplace"):
            return vllm_error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        config_file = Path(path) / "adapter_config.json"
        if not config_file.is_file():
            return vllm_error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        rank = int(json.loads(config_file.read_text()).get("r", 0))
        if rank > self.max_lora_rank:
            return vllm_error(400, f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.")
        from peft import PeftModel

        with self._model_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # peft: "adapter ... was active which is now deleted"
            model = self.backend.model
            if isinstance(model, PeftModel):
                if name in model.peft_config:
                    model.delete_adapter(name)
                model.load_adapter(path, adapter_name=name)
            else:
                self.backend.model = PeftModel.from_pretrained(model, path, adapter_name=name)
            self.backend.model.eval()
        self.adapters[name] = str(path)
        self.loads.append({"lora_name": name, "lora_path": str(path), "time": time.time()})
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def _unload(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body.get("lora_name")
        if not name:
            return vllm_error(400, "either 'lora_name' and 'lora_int_id' needs to be provided.", "InvalidUserInput")
        if name not in self.adapters:
            return vllm_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        with self._model_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = self.backend.model
            if len(model.peft_config) == 1:  # peft keeps at least one adapter: go back to the plain base
                self.backend.model = model.unload()
            else:
                model.delete_adapter(name)
        del self.adapters[name]
        self.unloads.append(name)
        return 200, f"Success: LoRA adapter '{name}' removed successfully."

    # ------------------------------------------------------------------ generation
    def _chat(self, body: dict[str, Any]) -> tuple[int, Any]:
        name = body.get("model")
        if name != self.served_name and name not in self.adapters:
            return vllm_error(404, f"The model `{name}` does not exist.", "NotFoundError")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return vllm_error(400, "messages must be a non-empty list")
        request = Request(tuple(Message(m["role"], m["content"]) for m in messages), "solve", 0,
                          seed=int(body.get("seed") or 0), max_tokens=int(body.get("max_tokens") or 16),
                          temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)))
        adapter = name if name in self.adapters else BASE
        with self._model_lock:
            mixed = hasattr(self.backend.model, "peft_config")
            completion = self.backend.generate([request], adapter_names=[adapter] if mixed else None)[0]
            prompt = self.backend.encode(request)
            ids = self._generated_ids(completion)
            logprobs = None
            if body.get("logprobs") and ids:
                logprobs = self._logprobs(prompt, ids, request.temperature, adapter if mixed else None,
                                          int(body.get("top_logprobs") or 0), bool(body.get("return_tokens_as_token_ids")))
        choice = {"index": 0, "message": {"role": "assistant", "content": completion.text},
                  "finish_reason": completion.finish_reason, "logprobs": logprobs}
        return 200, {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                     "model": name, "choices": [choice],
                     "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                               "total_tokens": len(prompt) + len(ids)}}

    def _generated_ids(self, completion: Any) -> list[int]:
        """The sampled ids (the completion's own when the backend gives them, else its text re-tokenised), with the
        end-of-sequence token when the model stopped at one."""
        if completion.token_ids is not None:
            ids = list(completion.token_ids)
        else:
            ids = list(self.backend.tokenizer(completion.text, add_special_tokens=False)["input_ids"])
        eos = self.backend.eos_ids
        if completion.finish_reason == "stop" and (not ids or ids[-1] not in eos):
            ids.append(eos[0])
        return ids

    @torch.no_grad()
    def _logprobs(self, prompt: list[int], ids: list[int], temperature: float, adapter: str | None, top: int,
                  as_ids: bool) -> dict[str, Any]:
        """OpenAI chat ``logprobs`` of ``ids`` after ``prompt``: one teacher-forced forward pass under the adapter."""
        model = self.backend.model
        inputs = torch.tensor([prompt + ids], device=self.backend.device)
        extra = {"adapter_names": [adapter]} if adapter is not None else {}
        logits = model(input_ids=inputs, **extra).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(ids)].float()
        log_dist = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
        chosen = log_dist.gather(1, torch.tensor(ids, device=log_dist.device)[:, None]).squeeze(1).tolist()

        def token(token_id: int) -> str:
            return f"token_id:{token_id}" if as_ids else self.backend.tokenizer.decode([token_id])

        content = []
        for step, (token_id, value) in enumerate(zip(ids, chosen)):
            best = torch.topk(log_dist[step], top) if top > 0 else None
            alternatives = [] if best is None else [
                {"token": token(int(i)), "logprob": float(v)} for v, i in zip(best.values.tolist(), best.indices.tolist())]
            text = token(token_id)
            content.append({"token": text, "logprob": max(float(value), -9999.0), "bytes": list(text.encode()),
                            "top_logprobs": alternatives})
        return {"content": content}


@contextlib.contextmanager
def lora_server(backend: Any, **kwargs: Any) -> Iterator[LoraServer]:
    """A ``LoraServer`` on a free port of 127.0.0.1 for the block; always stopped."""
    server = LoraServer(backend, **kwargs)
    try:
        yield server
    finally:
        server.close()

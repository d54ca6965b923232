"""Does the recording engine reproduce a completion from its request? (llama.cpp's server, as the sets record.)

    python bench/studies/recording_determinism.py --model ~/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python bench/studies/recording_determinism.py --engine transformers --dataset qwen05-arith --kinds critic --model GGUF

Takes the round-0 requests of the first --problems recorded test problems of --dataset (each agent's solve at the
set's temperature and its critic call at temperature 0, with the seeds the set sent), then answers them again
through fresh llama-server processes (bench/record/llama_server.sh, the sets' own flags) in several ways:

- ``batched``: all requests at once on a server with the recording's 16 slots (as the recorder sends a wave);
- ``batched again``: the same, a second time on the same server (its prompt cache now warm);
- ``restarted``: the same on a new server process;
- ``one by one``: one request at a time on a 16-slot server;
- ``1 slot``: all requests at once on a server with one slot (so they are decoded one after another);
- ``1 slot again``: the same on a new 1-slot server.

With ``--engine transformers`` the transformers backend (the format-1 set's engine, in the dtype its card names)
answers in process instead: ``batched`` (batches of 16), ``batched again`` (the same backend), ``restarted`` (the
model loaded again), ``one by one`` and ``batches of 4``; it writes ``recording_determinism_transformers.md``.
``--kinds critic`` keeps the temperature-0 critic calls only (short: on a CPU without bfloat16 instructions the
256-token solves take tens of minutes a way).

Reports, per way and per request kind, how many completions equal the set's recorded text, and how many equal
another way's text, and what each way cost in seconds. Writes bench/results/recording_determinism.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from bench.common.results import command_line, write_report
from deliberation_env.backends.openai import OpenAICompatibleBackend
from deliberation_env.cli import ArgumentParser
from deliberation_env.make import parallel_env
from deliberation_env.replay import ReplayBackend, ReplaySet

SERVER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "record", "llama_server.sh")


class Capturing(ReplayBackend):
    """A replay backend that keeps every request it answers, with the recorded completion."""

    def __init__(self, dataset: ReplaySet):
        super().__init__(dataset)
        self.seen: list = []

    def generate(self, requests):
        completions = super().generate(requests)
        self.seen.extend(zip(requests, completions))
        return completions


def recorded_requests(dataset: ReplaySet, problems: int) -> list:
    """(request, recorded completion) of the round-0 requests of the first ``problems`` recorded test problems."""
    backend = Capturing(dataset)
    env = parallel_env(backend=backend, split="test")
    for index in range(problems):
        env.reset(seed=index, options={"problem_index": index})
    return backend.seen


class Server:
    """llama-server on 127.0.0.1 with ``slots`` slots, started by the sets' own script, stopped on exit."""

    def __init__(self, model: str, slots: int, port: int, server: str | None):
        env = {**os.environ, "SLOTS": str(slots), "LLAMA_PORT": str(port)}
        if server:
            env["LLAMA_SERVER"] = server
        self.port = port
        self.process = subprocess.Popen(["bash", SERVER, model], env=env, start_new_session=True,
                                        stderr=subprocess.PIPE, text=True)
        served = self.process.stderr.readline().strip()  # "serving NAME on port P" once healthy
        if not served.startswith("serving "):
            raise SystemExit(f"llama-server did not start: {served or self.process.stderr.read()}")
        self.name = served.split()[1]

    def backend(self) -> OpenAICompatibleBackend:
        return OpenAICompatibleBackend(f"http://127.0.0.1:{self.port}/v1", self.name, timeout=1200)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait()


def transformers_backend(model: str, dataset: ReplaySet, batch_size: int):
    """The transformers backend on ``model`` with the set's dtype (from its model identity) and ``$THREADS``."""
    from deliberation_env.backends.transformers import TransformersBackend

    identity = dict(part.split("=", 1) for part in dataset.card.model.split(",")[1:] if "=" in part)
    return TransformersBackend(model, dtype=identity.get("dtype", "bfloat16"), batch_size=batch_size,
                               num_threads=int(os.environ.get("THREADS", 0)) or None)


def answer(backend, requests: list, one_by_one: bool) -> tuple[list[str], float]:
    began = time.perf_counter()
    batches = [[request] for request in requests] if one_by_one else [requests]
    completions = [c for batch in batches for c in backend.generate(batch)]
    return [c.text for c in completions], time.perf_counter() - began


LLAMA_WAYS = [("batched", 16, False), ("batched again", 16, False), ("restarted", 16, False),
              ("one by one", 16, True), ("1 slot", 1, False), ("1 slot again", 1, False)]
"""(way, slots, one request at a time) on llama.cpp's server; a way in ``FRESH`` starts a new server process."""
TRANSFORMERS_WAYS = [("batched", 16, False), ("batched again", 16, False), ("restarted", 16, False),
                     ("one by one", 16, True), ("batches of 4", 4, False)]
"""(way, batch size, one request at a time) on the transformers backend; a way in ``FRESH`` loads the model again."""
FRESH = ("batched", "restarted", "1 slot", "1 slot again", "batches of 4")


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the GGUF file the set was recorded with")
    parser.add_argument("--engine", choices=("llama.cpp", "transformers"), default="llama.cpp",
                        help="what answers: llama.cpp's server (the v2 sets' engine) or the transformers backend "
                             "(the format-1 set's), in the set's dtype")
    parser.add_argument("--kinds", nargs="+", default=None, help="only these request kinds (e.g. critic)")
    parser.add_argument("--server", default=None, help="the llama-server binary (default: $LLAMA_SERVER or PATH)")
    parser.add_argument("--dataset", default="qwen05-arith-v2")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--port", type=int, default=8095)
    args = parser.parse_args(argv)
    dataset = ReplaySet(args.dataset)
    pairs = [(r, c) for r, c in recorded_requests(dataset, args.problems) if not args.kinds or str(r.kind) in args.kinds]
    requests = [request for request, _ in pairs]
    texts: dict[str, list[str]] = {"recorded": [completion.text for _, completion in pairs]}
    seconds: dict[str, float] = {}
    server, port, backend = None, args.port, None
    for name, size, one_by_one in (LLAMA_WAYS if args.engine == "llama.cpp" else TRANSFORMERS_WAYS):
        if name in FRESH and args.engine == "transformers":
            backend = transformers_backend(args.model, dataset, size)
            model = f"{os.path.basename(args.model)} (transformers, {backend.settings.dtype})"
        elif name in FRESH:
            if server is not None:
                server.__exit__()
            server = Server(args.model, size, port, args.server)
            port += 1  # the stopped server may hold its port a moment longer
            backend, model = server.backend(), server.name
        texts[name], seconds[name] = answer(backend, requests, one_by_one)
        print(f"{name}: {seconds[name]:.0f} s", flush=True)
    if server is not None:
        server.__exit__()
    if model not in dataset.card.model:
        print(f"note: the server names itself {model!r}; the set was recorded by {dataset.card.model!r}")
    kinds = sorted({str(r.kind) for r in requests})
    names = list(texts)
    lines = [f"# Does the recording engine reproduce a completion? ({dataset.card.name})", "", f"`{command_line()}`",
             "", f"The round-0 requests of recorded test problems 0-{args.problems - 1} ({len(requests)}: "
             + ", ".join(f"{sum(str(r.kind) == k for r in requests)} {k}" for k in kinds)
             + f"), answered again through {model} on {os.environ.get('THREADS', os.cpu_count())} thread(s)"
             + f" (the set was recorded by {dataset.card.sampling.get('server', dataset.card.model)}). Cells: "
             "completions whose text equals the column's, of all.", "",
             "| way | seconds | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for way in names:
        cells = []
        for other in names:
            same = sum(a == b for a, b in zip(texts[way], texts[other]))
            cells.append(f"{same}/{len(requests)}")
        lines.append(f"| {way} | {seconds.get(way, float('nan')):.0f} | " + " | ".join(cells) + " |")
    for kind in kinds:
        picks = [i for i, r in enumerate(requests) if str(r.kind) == kind]
        temperature = {requests[i].temperature for i in picks}
        lines += ["", f"Requests of kind {kind} (temperature {sorted(temperature)}): equal to the recording: "
                  + ", ".join(f"{way} {sum(texts[way][i] == texts['recorded'][i] for i in picks)}/{len(picks)}"
                              for way in names[1:])]
    text = "\n".join(lines) + "\n"
    write_report("recording_determinism" + ("" if args.engine == "llama.cpp" else "_transformers"), text)


if __name__ == "__main__":
    main()

"""Ray rollout workers (baselines.meta.distributed) on a local Ray instance with 2 CPUs.

A tiny SoftRankPO run (SFT stage and RL stage both collected by the workers) ends with the same parameters
with 0, 1 and 2 workers; a worker whose process exits in the middle of a collection is replaced and the run
still ends with those parameters; a worker that keeps dying stops the run with a clear error.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

import deliberation_env
from baselines.meta import distributed
from baselines.meta.config import env_kwargs, make_env_fn
from baselines.meta.distributed import WorkerLost, concat_rollouts, shares
from baselines.meta.policy import agent_layout
from baselines.meta.rollout import EpisodeSpec, collect, sampling_key
from baselines.meta.softrankpo import SoftRankPOConfig, train
from baselines.meta.train import main
from deliberation_env.backends.sim import SimBackend

ray = pytest.importorskip("ray")  # installed by scripts/setup-tests.sh (the dev extra); CI turns a skip into a failure
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers get this module's env factories by value


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def tiny(tmp_path, workers: int, name: str) -> SoftRankPOConfig:
    return SoftRankPOConfig(episodes=32, group_size=4, groups_per_batch=4, num_envs=4, sft_episodes=16, sft_epochs=2,
                            epochs=1, minibatches=2, hidden=16, seed=3, progress=False, tensorboard=False,
                            num_workers=workers, out=str(tmp_path / name))


class CrashingBackend:
    """The sim, except that the first ``generate`` in a process that finds no ``marker`` file exits that process
    (the marker is created first, so exactly one crash happens across all workers and restarts)."""

    def __init__(self, marker: str):
        self.inner, self.marker = SimBackend(), marker

    def identity(self) -> str:
        return self.inner.identity()

    def generate(self, requests):
        if self.marker:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
                os._exit(1)
            except FileExistsError:
                self.marker = ""
        return self.inner.generate(requests)


class CrashingEnvs:
    """The envs of ``cfg`` on a ``CrashingBackend``."""

    def __init__(self, cfg: SoftRankPOConfig, marker: str, always: bool = False):
        self.cfg, self.marker, self.always = cfg, marker, always

    def __call__(self):
        if self.always and os.path.exists(self.marker):
            os.remove(self.marker)  # every worker process crashes: a run that cannot complete its batch
        return deliberation_env.parallel_env(backend=CrashingBackend(self.marker), **env_kwargs(self.cfg, "train"))


def parameters(policy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policy.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    return parameters(train(tiny(tmp_path_factory.mktemp("runs"), 0, "w0")))


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_train_the_same_policy_as_one_process(tmp_path, single_process, workers):
    assert_same(parameters(train(tiny(tmp_path, workers, f"w{workers}"))), single_process)


def test_a_worker_killed_mid_collection_is_replaced_and_the_batch_completes(tmp_path, single_process):
    marker = str(tmp_path / "crashed")
    cfg = tiny(tmp_path, 2, "crash")
    policy = train(cfg, env_fn=CrashingEnvs(cfg, marker))
    assert os.path.exists(marker)  # a worker did exit mid-collection
    assert_same(parameters(policy), single_process)


def test_a_worker_that_keeps_dying_stops_the_run_with_a_clear_error(tmp_path):
    marker = str(tmp_path / "crashed")
    collector = distributed.RayCollector(CrashingEnvs(SoftRankPOConfig(), marker, always=True), wave=2, workers=1, max_restarts=1)
    specs = [EpisodeSpec(seed, 0) for seed in range(4)]
    layout = agent_layout(collector.env)
    try:
        with pytest.raises(WorkerLost, match=r"rollout worker 0 died 2 times while playing episodes 0\.\.3"):
            collector.collect(layout, None, specs, sampling_key(0, "test"))
    finally:
        collector.close()


def test_shares_are_whole_waves_and_concatenation_keeps_episode_order():
    assert shares(16, 4, 2) == [range(0, 8), range(8, 16)]
    assert shares(14, 4, 3) == [range(0, 8), range(8, 12), range(12, 14)]
    assert shares(4, 4, 2) == [range(0, 4)]
    env_fn = make_env_fn(SoftRankPOConfig())
    envs = [env_fn() for _ in range(2)]
    layout = agent_layout(envs[0])
    specs = [EpisodeSpec(seed, seed // 2, stream=seed) for seed in range(6)]
    whole = collect(envs, layout, None, specs, (5,))
    parts = concat_rollouts([collect(envs, layout, None, specs[s.start:s.stop], (5,)) for s in shares(6, 2, 2)])
    for name in ("obs", "actions", "logp", "rewards", "episode", "group", "agent", "step"):
        assert (getattr(whole, name) == getattr(parts, name)).all(), name
    assert whole.episodes == parts.episodes


def test_cli_flags_and_one_line_errors(tmp_path, capsys, monkeypatch):
    for argv, message in ((["--num-workers", "-1"], "num_workers must be >= 0"),
                          (["--ray-address", "auto"], "--ray-address needs --num-workers N")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(SystemExit) as exit_info:
        main(["--num-workers", "2", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and 'pip install "deliberation-env[ray]"' in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_cli_trains_with_workers(tmp_path, capsys):
    out = tmp_path / "cli"
    main(["--algo", "grpo", "--num-workers", "2", "--episodes", "16", "--group-size", "4", "--groups-per-batch", "4",
          "--num-envs", "2", "--hidden", "8", "--no-progress", "--no-tensorboard", "--no-evaluate", "--out", str(out)])
    assert (out / "policy.pt").exists()

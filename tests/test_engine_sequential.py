"""Games beyond the recording (``refine_rounds``): a one-round set played for more rounds, the later ones with PERSIST
and CONCEDE only, compiled exactly; and the compiler's cache: one key per game, a changed file or array refused."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
from test_engine import compare_every_sequence

from deliberation_env.engine import StaleTree, compile_tree
from deliberation_env.engine import tree as tree_module
from deliberation_env.make import replay_env
from deliberation_env.replay import ReplayError, ReplaySet


@functools.lru_cache(maxsize=2)
def loaded(name: str) -> ReplaySet:
    return ReplaySet(name)


SEQUENTIAL = [("qwen05-arith-v2", {"features": "v2"}, [5, 120]), ("qwen05-team-arith", {"features": "v2"}, [9]),
              ("qwen05-team-arith", {"features": "v3", "concede_to_peer": True}, [77])]


@pytest.mark.parametrize("name,game,problems", SEQUENTIAL, ids=[f"{n}-{g['features']}" for n, g, _ in SEQUENTIAL])
def test_every_sequence_of_a_two_round_game_beyond_the_recording_plays_as_the_env(name, game, problems):
    """A one-round set played for two rounds, the second with PERSIST and CONCEDE only (refine_rounds=1): every
    joint-action sequence of sampled problems, tree against env (15,625 of them per problem with chosen targets)."""
    game = {**game, "max_rounds": 2, "refine_rounds": 1}
    tree = compile_tree(loaded(name), "test", problems=problems, cache=False, **game)
    env = replay_env(loaded(name), "test", invalid_action="persist", **game)
    env.problems = [env.problems[i] for i in problems]  # the tree's problem indices are the subset's
    second = tree.mask[tree.depth == 1]
    assert second.shape[0] and not second[..., 1].any()  # no REFINE in round 2
    assert (tree.tokens[tree.depth == 2] == 0).all()  # and no request at all: no critic after a CONCEDE either
    assert compare_every_sequence(tree, env, range(len(problems)), [0], rounds=2) == len(problems) * tree.num_joint ** 2


def test_equal_games_share_one_cache_key_and_a_changed_file_is_compiled_again(tmp_path, monkeypatch):
    monkeypatch.setenv("DELIBERATION_ENV_CACHE", str(tmp_path))
    first = compile_tree(loaded("qwen05-arith-v2"), "test", problems=[3, 4])
    for same in ({"features": "v1"}, {"concede_to_peer": False}, {"features": "v1", "observation": "flat"}):
        assert tree_module.tree_key(loaded("qwen05-arith-v2"), "test", tree_module.reference_env(
            loaded("qwen05-arith-v2"), "test", same).config, [3, 4]) == first.key
    files = list((tmp_path / "trees").glob("*.npz"))
    assert len(files) == 1
    with np.load(files[0]) as data:  # one stored outcome flipped behind the digest's back
        arrays = {name: data[name] for name in data.files}
    arrays["consensus_correct"] = ~arrays["consensus_correct"]
    np.savez(files[0], **arrays)
    with pytest.raises(StaleTree, match="changed"):
        tree_module.CompiledTree.load(files[0])
    again = compile_tree(loaded("qwen05-arith-v2"), "test", problems=[3, 4])
    assert np.array_equal(again.consensus_correct, first.consensus_correct)


def test_the_cache_check_compares_labels_and_reward_components():
    game = {"max_rounds": 2, "refine_rounds": 1}
    env = tree_module.reference_env(loaded("qwen05-arith-v2"), "test", game)
    compiled = compile_tree(loaded("qwen05-arith-v2"), "test", problems=[3], cache=False, **game)
    tree_module.verify(compiled, env, 4)
    for name in ("oracle", "correct", "consensus_correct", "components"):
        tree = copy.deepcopy(compiled)
        array = getattr(tree, name)
        array[...] = (1 - array) if array.dtype == bool else array + 1  # every entry changed
        with pytest.raises(StaleTree):
            tree_module.verify(tree, env, 4)


def test_the_code_fingerprint_covers_every_module_the_reference_env_imports():
    names = {path.relative_to(path.parents[1]).as_posix() if path.parent.name != "deliberation_env"
             else path.name for path in tree_module.source_files()}
    assert {"vector.py", "env.py", "chat.py", "core/deliberation.py", "engine/walk.py", "tasks/arithmetic.py",
            "replay/dataset.py"} <= names


def test_a_set_plays_more_rounds_only_without_refine_beyond_its_recording():
    with pytest.raises(ReplayError, match="refine_rounds=1"):
        replay_env(loaded("qwen05-arith-v2"), "test", max_rounds=2)
    env = replay_env(loaded("qwen05-arith-v2"), "test", max_rounds=3, refine_rounds=1, invalid_action="raise")
    observations, infos = env.reset(seed=0, options={"problem_index": 12})
    assert all(observations[a]["action_mask"][1] for a in env.agents)  # round 1 offers REFINE
    observations, _, _, _, infos = env.step({a: 1 for a in env.agents})
    for agent in env.agents:  # round 2 does not, and its oracle label is legal
        assert observations[agent]["action_mask"][1] == 0
        assert observations[agent]["action_mask"][infos[agent]["oracle_action"]] == 1
    with pytest.raises(ValueError, match="masked"):
        env.step({a: 1 for a in env.agents})


def test_the_code_fingerprint_reads_code_not_its_documentation():
    code = 'def f(x):\n    """What f does."""\n    return x + 1  # the why\n'
    assert tree_module.code_of(code) == tree_module.code_of('def f(x):\n    """Another text."""\n\n    return x + 1\n')
    assert tree_module.code_of(code) != tree_module.code_of('def f(x):\n    """What f does."""\n    return x + 2\n')

"""Constructor settings as one dataclass (``deliberation_env.settings``): the OpenAI-compatible and transformers backends
and the text env take ``settings=`` or its fields as keywords (the keywords users have always passed), refuse unknown
ones naming the fields, and the backends' old attributes read and write their settings."""

from __future__ import annotations

import pytest

import deliberation_env
from deliberation_env.backends.openai import DEADLINE_FACTOR, OpenAICompatibleBackend, OpenAISettings
from deliberation_env.text import TextEnvSettings
from tests.test_replay import same as equal

URL = "http://127.0.0.1:9/v1"  # never contacted: a backend connects on its first request


def test_the_openai_backend_takes_its_settings_as_keywords_or_as_one_object():
    by_keywords = OpenAICompatibleBackend(URL, "m", timeout=30, concurrency=4, logprobs=False, agent_models=("a", "b"))
    by_object = OpenAICompatibleBackend(URL, "m", settings=OpenAISettings(timeout=30, concurrency=4, logprobs=False,
                                                                            agent_models=("a", "b")))
    assert by_keywords.settings == by_object.settings and by_keywords.identity() == by_object.identity()
    assert by_keywords.settings.deadline == DEADLINE_FACTOR * 30 and by_keywords.settings.deadline_is_default
    assert by_keywords.settings.per_replica == 4 and by_keywords.settings.agent_models == ["a", "b"]
    assert by_keywords.identity().endswith(",logprobs=off,agent_models=a|b")
    assert OpenAICompatibleBackend(URL, "m").settings == OpenAISettings()  # the defaults are the dataclass's


def test_a_backend_s_old_attributes_read_and_write_its_settings(monkeypatch):
    backend = OpenAICompatibleBackend(URL, "m", timeout=30)
    with monkeypatch.context() as patch:  # data descriptors: a patched setting is restored, not deleted
        patch.setattr(backend, "concurrency", 2)
        assert backend.settings.concurrency == 2
    assert backend.settings.concurrency == 16
    assert (backend.timeout, backend.concurrency, backend.routing) == (30, 16, "sticky")
    backend.max_retries = 0
    assert backend.settings.max_retries == 0
    backend.failovers = 3  # not a setting: the backend's own attribute
    assert backend.failovers == 3 and not hasattr(backend.settings, "failovers")
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        backend.nonsense  # noqa: B018


@pytest.mark.parametrize("make, message", [
    (lambda: OpenAICompatibleBackend(URL, "m", time_out=3), r"unknown keyword\(s\) \['time_out'\]; its settings "
                                                            r"\(OpenAISettings\): api_key_env, timeout"),
    (lambda: OpenAICompatibleBackend(URL, "m", OpenAISettings(), timeout=3), "pass settings= or the keywords"),
    (lambda: OpenAICompatibleBackend(URL, "m", "OPENAI_API_KEY"), "settings must be a OpenAISettings, got str"),
    (lambda: OpenAICompatibleBackend(URL, "m", concurrency=0), "concurrency must be a positive int"),
])
def test_a_wrong_setting_is_one_error_naming_it(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_the_transformers_backend_checks_its_keywords_before_it_loads_anything():
    pytest.importorskip("torch")
    from deliberation_env.backends.transformers import TransformersBackend, TransformersSettings

    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['batchsize'\]; its settings \(TransformersSettings\)"):
        TransformersBackend("no/such/model", batchsize=4)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        TransformersBackend("no/such/model", batch_size=0)
    assert TransformersSettings(dtype="float32", share_prefill=False).drop_finished


def test_the_text_env_takes_its_own_settings_as_keywords_or_as_one_object():
    counted = len
    env = deliberation_env.text_env(task="arithmetic", meta_policy="self_consistency", max_prompt_chars=4000,
                                    count_tokens=counted, max_rounds=1)
    same = deliberation_env.text_env(task="arithmetic", max_rounds=1, settings=TextEnvSettings(
        meta_policy="self_consistency", max_prompt_chars=4000, count_tokens=counted))
    assert env.settings == same.settings and env.max_prompt_chars == 4000 and env.count_tokens is counted
    assert env.max_action_chars == 8 * env.config.max_tokens  # None: derived from the config
    equal(env.reset(seed=0), same.reset(seed=0))
    with pytest.raises(TypeError, match="pass settings= or the keywords"):
        deliberation_env.text_env(task="arithmetic", settings=TextEnvSettings(), critic="agent")
    with pytest.raises(ValueError, match="max_prompt_chars must be an integer >= 1"):
        deliberation_env.text_env(task="arithmetic", max_prompt_chars=0)
    with pytest.raises(TypeError, match="unknown option"):
        deliberation_env.text_env(task="arithmetic", meta_polciy="debate")  # neither its setting nor an env option

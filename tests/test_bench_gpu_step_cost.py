"""``bench/benchmark/gpu_step_cost.py`` runs end to end on the CPU with tiny shapes (on a GPU it times the preset's shapes):
the trainer's ``policy_update`` over random ids on a LoRA team, then ``generate``, and writes its table."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")


def test_the_script_times_an_update_and_a_generate_call(monkeypatch, tmp_path):
    from bench.common import results
    monkeypatch.setattr(results, "RESULTS", str(tmp_path))
    from bench.benchmark import gpu_step_cost as script
    script.main(["--device", "cpu", "--architecture", "tiny", "--sequences", "8", "--prompt", "10", "--completion", "6",
                 "--micro-batch", "4", "--updates", "1", "--generate-batch", "2", "--new", "4", "--generate-batches", "1"])
    text = (tmp_path / "gpu_step_cost.md").read_text()
    assert "| loss pass + AdamW step (policy_update) | 8 x (10 + 6) tokens = 128, micro-batch 4, 1 updates |" in text
    assert "| generate (evaluation) | 2 rows x 10 prompt + 4 new tokens, 1 calls |" in text

"""The off-policy path: warm-up, the replay ratio, batch shapes and the buffer's device."""

from __future__ import annotations

import pytest

from tests.helpers import chain_config, fit, write_config


@pytest.mark.parametrize(
    ("frames_per_update", "updates", "expected_frames"), [(4, 20, 136), (0.5, 40, 80), (3, 10, 88)]
)
def test_frames_per_update_sets_the_replay_ratio(tmp_path, frames_per_update, updates, expected_frames):
    # 8 envs → 8 frames per collect; warm-up 64 frames; the collect that reaches frame 64 earns credit already.
    # Each collect earns 8 / frames_per_update updates, so U updates take ceil(U * frames_per_update / 8) collects
    # from frame 56 on:  4 → 20 updates: 10 collects → 136 frames;  0.5 → 40 updates: 3 collects → 80 frames;
    # 3 → 10 updates: ceil(3.75) = 4 collects → 88 frames (the fractional credit carries over).
    config = chain_config("dqn", tmp_path, frames_per_update=frames_per_update, warmup_frames=64)
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", str(updates))
    data = cli.datamodule
    assert data.frames == expected_frames
    assert data.samples == updates * 32
    earned = (data.frames - 56) / frames_per_update  # frames from the collect that completed the warm-up on
    assert earned - data.update_credit == pytest.approx(updates)


def test_batches_are_whole_tensordicts_from_the_buffer_device(tmp_path):
    cli = fit(write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml"), "--trainer.max_steps", "2")
    batch = cli.datamodule.buffer.sample()
    assert batch.batch_size == (32,)
    assert {"observation", "action", ("next", "reward"), ("next", "observation")} <= set(batch.keys(True))
    assert "collector" not in batch.keys()  # noqa: SIM118
    assert batch.device == cli.datamodule.device

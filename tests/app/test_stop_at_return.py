"""PeriodicEvaluation's ``stop_at_return``: a frame-based run ends at the first evaluation that reaches a threshold."""

import pytest

from callbacks.schedule import PeriodicEvaluation
from tests.helpers import chain_config, fit, write_config


@pytest.mark.slow
def test_training_stops_at_the_first_evaluation_that_reaches_the_threshold(tmp_path):
    config = chain_config("dqn", tmp_path)
    evaluation = {
        "class_path": "callbacks.schedule.PeriodicEvaluation",
        "init_args": {"every_n_frames": 80, "episodes": 8, "stop_at_return": 0.99},
    }
    config["trainer"]["callbacks"].append(evaluation)
    cli = fit(write_config(config, tmp_path / "c.yaml"), "--trainer.max_steps", "3000")
    history = next(cb for cb in cli.trainer.callbacks if isinstance(cb, PeriodicEvaluation)).history
    returns = [row["eval/return_mean"] for row in history]
    assert returns[-1] >= 0.99 and all(value < 0.99 for value in returns[:-1])  # the first one that reached it
    assert 0 < cli.trainer.global_step < 3000
    assert history[-1]["updates"] == cli.trainer.global_step  # stopped right after that evaluation
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()  # and ended as a run does: its checkpoint written

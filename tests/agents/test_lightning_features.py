"""What Lightning supplies, working through our loop: mixed precision, compile, DDP on CPU, and `validate`."""

from __future__ import annotations

import shutil
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
from tensordict import TensorDict

from app.cli import main
from modules.dqn import DQN
from modules.networks import NetworkOptions
from modules.ppo import PPO, PPOLossOptions
from tests.helpers import ROOT, chain_config, fit, write_config


@pytest.mark.slow
@pytest.mark.parametrize("agent", ["dqn", "ppo"])
def test_bf16_mixed_precision_trains_with_finite_loss(tmp_path, agent):
    config = write_config(chain_config(agent, tmp_path), tmp_path / "c.yaml")
    cli = fit(
        config, "--trainer.precision", "bf16-mixed", "--trainer.max_steps", "20", "--trainer.log_every_n_steps", "5"
    )
    assert cli.trainer.precision == "bf16-mixed"
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert cli.trainer.global_step == 20 and cli.datamodule.frames > 0


def loss_batch(size: int) -> TensorDict:
    obs = torch.randint(0, 2, (size, 2), dtype=torch.uint8)
    done = torch.zeros(size, 1, dtype=torch.bool)
    return TensorDict(
        {
            "observation": obs,
            "action": torch.randint(0, 2, (size,)),
            "action_log_prob": torch.full((size,), -0.7),
            "advantage": torch.randn(size, 1),
            "value_target": torch.randn(size, 1),
            "next": {"observation": obs.flip(-1), "reward": torch.randn(size, 1), "done": done, "terminated": done},
        },
        batch_size=[size],
    )


@pytest.mark.slow
@pytest.mark.parametrize("cls", [DQN, PPO])
def test_compiled_and_eager_losses_agree_on_the_same_batch(cls):
    from tests.agents.test_dqn import SPECS

    torch.manual_seed(0)
    model = cls(**SPECS, network=NetworkOptions(hidden_sizes=(16,)), compile=True)
    compiled_loss = model.compiled(model.loss)
    assert compiled_loss is not model.loss
    # The compiled loss keeps only the batch's guards: a batch of another size, or with another entry (prioritized
    # replay's weights, which DQN's loss applies), must still be recompiled for, and a change of the weights in
    # place (an optimizer step) must be seen.
    for size, weighted in ((8, False), (8, False), (24, False), (8, True), (8, False)):
        batch = loss_batch(size)
        if weighted:
            batch["priority_weight"] = torch.rand(size)
        eager_losses, compiled_losses = model.loss(batch.clone()), compiled_loss(batch.clone())
        for key in eager_losses.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch)
            if key.startswith("loss") or key == "td_error":
                torch.testing.assert_close(compiled_losses[key], eager_losses[key], rtol=1e-5, atol=1e-6)
        assert compiled_losses.keys() == eager_losses.keys()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the probe starts where the update compiles for the CPU")
def test_a_compiled_model_checks_the_cpus_vector_instructions_before_its_first_compilation():
    """Building a model with compile on starts Inductor's once-a-process probe of the CPU's vector instruction sets in
    a background thread (compat.torch.probe_cpu_vector_isa_early), so that the first compiled update does not wait
    for it; an eager model starts nothing. In a fresh process: this one's probe may have run already."""
    script = """
import threading
from torch._inductor import cpu_vec_isa
import compat.torch
from modules.dqn import DQN
from tests.agents.test_dqn import SPECS
DQN(**SPECS)
assert compat.torch._VECTOR_ISA_PROBE is None
DQN(**SPECS, compile=True)
probe = compat.torch._VECTOR_ISA_PROBE
assert isinstance(probe, threading.Thread) and probe.name == "vector-isa-probe"
probe.join(timeout=300)
assert not probe.is_alive()
assert cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 1  # Inductor's own answer, kept for the process
DQN(**SPECS, compile=True)
assert compat.torch._VECTOR_ISA_PROBE is probe  # once a process
print("probed", [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()])
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "probed" in done.stdout


def test_each_model_compiles_its_own_loss_in_a_process_of_several():
    # The compiled loss drops Dynamo's guards on the model, and Dynamo caches compiled code per function: models in
    # one process (a notebook, a test, a search) must not replay another's graph, whose constants (gamma) and
    # parameter shapes are the other's. Same sizes and another gamma; then other sizes.
    from tests.agents.test_dqn import SPECS

    batch = loss_batch(8)
    for cls, gamma, hidden, entropy in (
        (DQN, 0.99, 16, 0),
        (DQN, 0.5, 16, 0),
        (DQN, 0.9, 24, 0),
        (PPO, 0.99, 16, 0.0),
        (PPO, 0.99, 16, 0.1),
        (PPO, 0.99, 24, 0.1),
    ):
        torch.manual_seed(0)
        options = {"gamma": gamma} if cls is DQN else {"loss": PPOLossOptions(entropy_coef=entropy)}
        model = cls(**SPECS, network=NetworkOptions(hidden_sizes=(hidden,)), compile=True, **options)
        eager, compiled = model.loss(batch.clone()), model.compiled(model.loss)(batch.clone())
        for key in eager.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch)
            if key.startswith("loss"):
                torch.testing.assert_close(compiled[key], eager[key], rtol=1e-5, atol=1e-6, msg=f"{cls.__name__} {key}")
        if cls is PPO:  # the entropy term trains only with a weight: its gradient must follow the model's option
            assert compiled["loss_entropy"].requires_grad == eager["loss_entropy"].requires_grad


@pytest.mark.slow
def test_a_model_compiles_a_static_graph_whatever_another_model_compiled_before():
    # Dynamo's automatic dynamic shapes remember the batch sizes a function saw by its file, line and name, across
    # models: without dynamic=False a model compiled after another model's loss of another batch size would compile a
    # dynamic graph, whose numbers are not a fresh process's to the bit (an exact resume compares them). This model's
    # graph must be static: a third batch size recompiles.
    from tests.agents.test_dqn import SPECS

    for size in (8, 16):
        torch.manual_seed(0)
        model = DQN(**SPECS, network=NetworkOptions(hidden_sizes=(16,)), compile=True)
        loss = model.compiled(model.loss)
        loss(loss_batch(size))
    with torch.compiler.set_stance("fail_on_recompile"), pytest.raises(RuntimeError, match="recompil"):
        loss(loss_batch(24))


@pytest.mark.slow
def test_compiled_update_trains_to_the_same_weights_as_eager(tmp_path):
    # The whole update compiled (loss with its backward, clip + fused Adam step, soft target update): after 40 updates
    # and the collection between them, the weights are those of the eager run up to float rounding.
    runs = {}
    for compile_ in ("false", "true", "cudagraph"):
        config = chain_config("dqn", tmp_path / compile_)
        compile_option = {"false": False, "true": True}.get(compile_, compile_)
        config["model"]["init_args"].update(compile=compile_option, optimizer={"max_grad_norm": 1.0})
        config["model"]["init_args"]["target"]["update"] = "soft"
        cli = fit(write_config(config, tmp_path / f"{compile_}.yaml"), "--trainer.max_steps", "40")
        assert cli.trainer.global_step == 40
        assert cli.model._graphed_update is None  # no CUDA graph on a CPU: cudagraph is the compiled update there
        runs[compile_] = cli.model.state_dict()
    assert runs["true"].keys() == runs["false"].keys()  # compiling a function leaves parameter names alone
    for key, eager in runs["false"].items():
        torch.testing.assert_close(runs["true"][key], eager, rtol=0, atol=1e-6, msg=key)
        assert torch.equal(runs["cudagraph"][key], runs["true"][key]), key
    assert not torch.equal(
        runs["true"]["q_network.1.0.weight"],
        runs["true"]["loss_module.target_value_network_params.module.0.module.1.0.weight"],
    )


CUDA_GRAPH = ["--model.init_args.compile", "cudagraph"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("configs", "args", "reason"),
    [
        (
            [],
            ["--model.init_args.optimizer.accumulate_grad_batches", "2"],
            "gradient accumulation (optimizer.accumulate_grad_batches 1)",
        ),
        (
            [],
            ["--model.init_args.optimizer.lr_end", "1e-4"],
            "a learning-rate schedule: the step's lr is captured once",
        ),
        ([], ["--model.init_args.optimizer.weight_decay", "0.01"], "AdamW's step, which is not capturable here"),
        ([], ["--data.init_args.priority.alpha", "0.6"], "prioritized replay's priorities (priority.alpha 0)"),
        (["configs/pirl_toy.yaml"], [], "PhysicsInformedDQN's loss inputs drawn each update"),
        (["configs/racing_sac.yaml", "configs/bench/sac_scratch.yaml"], [], "SAC's random draws inside the update"),
    ],
)
def test_a_whole_update_cuda_graph_is_refused_where_replaying_it_could_not_be_exact(
    tmp_path, capsys, configs, args, reason
):
    # Checked when the model meets its data module, before anything runs, on any machine: a CPU test sees the rules.
    paths = [str(ROOT / c) for c in configs] or [
        str(write_config(chain_config("dqn", tmp_path / "out"), tmp_path / "c.yaml"))
    ]
    save_dir = ["--trainer.logger.init_args.save_dir", str(tmp_path / "out")] if configs else []  # shipped: logger on
    with pytest.raises(SystemExit) as exited:
        main(["fit", *(a for p in paths for a in ("--config", p)), *save_dir, *CUDA_GRAPH, *args])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --model.init_args.compile cudagraph cannot capture "), lines
    assert reason in lines[0] and lines[0].endswith(": use compile true")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_validate_plays_greedy_episodes_from_a_checkpoint(tmp_path):
    config = write_config(chain_config("dqn", tmp_path), tmp_path / "c.yaml")
    fit(config, "--trainer.max_steps", "200")
    # Validation reads the weights, not the replay buffer: a checkpoint copied without its buffer's folder validates.
    for folder in (tmp_path / "checkpoints").glob("last.ckpt.replay-*"):
        shutil.rmtree(folder)
    cli = main(["validate", "--config", str(config), "--ckpt_path", str(tmp_path / "checkpoints/last.ckpt")])
    metrics = cli.trainer.callback_metrics
    assert {"eval/return_mean", "eval/length_mean"} <= set(metrics)
    # The chain's optimum is +1 in 5 steps; 200 updates are plenty to learn it.
    assert metrics["eval/return_mean"] == pytest.approx(1.0)
    assert metrics["eval/length_mean"] == pytest.approx(5.0)


class BackwardWatcher(pl.Callback):
    """A callback with backward hooks: each update's backward then goes through Lightning, which calls them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def on_before_backward(self, trainer, pl_module, loss):
        self.calls.append(("before", trainer.global_step))

    def on_after_backward(self, trainer, pl_module):
        self.calls.append(("after", trainer.global_step))


@pytest.mark.parametrize("agent", ["dqn", "ppo"])
def test_a_backward_past_lightning_trains_as_lightnings_and_hooks_still_run(tmp_path, agent):
    """Where Lightning would do nothing around the backward (one device, full precision, no backward hooks), the update
    calls ``loss.backward()`` itself: the same weights after 30 updates as through ``manual_backward``; a callback
    with backward hooks sends every backward through Lightning again, and its hooks see each update."""
    from compat.lightning import backward_is_plain

    def run(name: str, *extra: str):
        config = write_config(chain_config(agent, tmp_path / name), tmp_path / f"{name}.yaml")
        cli = fit(config, "--trainer.max_steps", "30", "--trainer.enable_progress_bar", "false", *extra)
        return cli, {key: value.clone() for key, value in cli.model.state_dict().items()}

    plain, plain_weights = run("plain")
    assert backward_is_plain(plain.trainer, plain.model) and plain.model._plain_backward
    hooked, hooked_weights = run("hooked", "--trainer.callbacks+=tests.agents.test_lightning_features.BackwardWatcher")
    assert not hooked.model._plain_backward
    watcher = next(callback for callback in hooked.trainer.callbacks if isinstance(callback, BackwardWatcher))
    assert watcher.calls == [(when, update) for update in range(30) for when in ("before", "after")]
    assert plain_weights.keys() == hooked_weights.keys()
    for key, value in plain_weights.items():
        assert torch.equal(hooked_weights[key], value), key

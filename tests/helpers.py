"""Shared helpers for the tests: tiny configs on the chain env, and running the real CLI in-process."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml

from app.__main__ import dispatch
from app.cli import main

ROOT = Path(__file__).resolve().parents[1]  # the repository
CHAIN = {"class_path": "envs.testing.chain.ChainEnv", "init_args": {"length": 6, "max_steps": 30}}
RECALL = {"class_path": "envs.testing.recall.CueRecallEnv", "init_args": {"num_agents": 4, "length": 4}}


#: Flags of a resume under another global seed that keep the environments' seed (``seed_everything`` alone would
#: reseed them too): only a complete restore (weights, RNG states, environments, buffers) then matches the
#: uninterrupted run.
RESEEDED = ("--seed_everything", "123", "--data.init_args.seed", "0")

#: ``collection`` of a replay data module that prepares each round in a background thread.
PREFETCH = {"class_path": "datamodules.collection.InProcess", "init_args": {"prefetch": True}}


def benchmark_module(name: str) -> Any:
    """``benchmarks/<name>.py`` imported (benchmarks/ is not a package), under its own name in ``sys.modules``, where
    dataclasses look their module up."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chain_config(agent: str, root: Path, **data: Any) -> dict:
    """A tiny DQN, QR-DQN, PPO or A2C run on the chain env, or a recurrent PPO one (``recurrent``) on cue recall,
    writing under ``root``; ``data`` overrides data init_args."""
    if agent == "recurrent":
        model = {
            "class_path": "modules.recurrent_ppo.RecurrentPPO",
            "init_args": {
                "network": {"lstm_hidden": 32, "trunk_features": 32, "grid_features": 2, "grid_size": 11},
                "optimizer": {"lr": 0.003},
            },
        }
        data_cfg = {
            "class_path": "datamodules.rollout.RolloutDataModule",
            "init_args": {
                "env": RECALL,
                **{"num_envs": 8, "collect_steps": 16, "minibatch_size": 128, "update_epochs": 2, "bptt": 8},
            },
        }
    elif agent in ("dqn", "qrdqn"):
        model = {
            "class_path": "modules.dqn.DQN" if agent == "dqn" else "modules.qrdqn.QRDQN",
            "init_args": {
                "network": {"hidden_sizes": [32]},
                "exploration": {"eps_frames": 400},
                "target": {"interval": 20},
                **({"quantiles": 8} if agent == "qrdqn" else {}),
            },
        }
        data_cfg = {
            "class_path": "datamodules.replay.ReplayDataModule",
            "init_args": {"env": CHAIN, "num_envs": 8, "batch_size": 32, "warmup_frames": 64, "frames_per_update": 2},
        }
    elif agent == "a2c":  # one update on each whole rollout, RMSprop
        model = {"class_path": "modules.a2c.A2C", "init_args": {"network": {"hidden_sizes": [32]}}}
        data_cfg = {
            "class_path": "datamodules.rollout.RolloutDataModule",
            "init_args": {"env": CHAIN, "num_envs": 8, "collect_steps": 4, "minibatch_size": 32, "update_epochs": 1},
        }
    else:
        model = {
            "class_path": "modules.ppo.PPO",
            "init_args": {"network": {"hidden_sizes": [32]}, "optimizer": {"lr": 0.003}},
        }
        data_cfg = {
            "class_path": "datamodules.rollout.RolloutDataModule",
            "init_args": {"env": CHAIN, "num_envs": 8, "collect_steps": 16, "minibatch_size": 32, "update_epochs": 2},
        }
    data_cfg["init_args"].update(data)
    return {
        "threads": 1,
        "seed_everything": 0,
        "trainer": {
            "max_steps": 100,
            "default_root_dir": str(root),
            "logger": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [{"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 10**9}}],
        },
        "model": model,
        "data": data_cfg,
    }


def evaluated_chain_config(agent: str, every_n_frames: int, max_steps: int) -> dict:
    """A chain config for the commands that run it in several processes (``seeds``, ``tune``): a CSV logger into
    ``runs/chain`` and an evaluation every ``every_n_frames`` frames."""
    config = chain_config(agent, Path("unused"))
    config["trainer"]["logger"] = {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs", "name": "chain"},
    }
    evaluation = {
        "class_path": "callbacks.schedule.PeriodicEvaluation",
        "init_args": {"every_n_frames": every_n_frames},
    }
    config["trainer"]["callbacks"].append(evaluation)
    config["trainer"]["max_steps"] = max_steps
    return config


DOCS = ROOT / "docs"  # the documentation site's pages (mkdocs.yml at the root)


def doc_section(page: str, section: str | None = None) -> str:
    """The text of ``docs/<page>``, or of its section ``section`` (its ``## `` title) up to the next ``## `` title;
    a ``#`` line inside a code block is code, not a title."""
    lines = (DOCS / page).read_text().splitlines(keepends=True)
    if section is None:
        return "".join(lines)
    found: list[str] | None = None
    fenced = False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            if found is not None:
                break
            if line.rstrip("\n") == f"## {section}":
                found = []
                continue
        if found is not None:
            found.append(line)
    assert found is not None, f"docs/{page} has no section '## {section}'"
    return "".join(found)


def doc_code_blocks(page: str, section: str | None = None) -> dict[str, str]:
    """The fenced code blocks of ``docs/<page>`` (of its section ``section``, if given), by language: the last of
    each. What the docs show is what these tests run."""
    text = doc_section(page, section)
    return dict(re.findall(r"^```(\w+)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL))


def write_config(config: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def racing_transitions(rows: int = 64) -> Any:
    """One step of ``rows`` racing cars (a box of unequal half-ranges, per dimension) at random actions, as a replay
    sample: a loss's test batch, a third of whose transitions end their episode."""
    from envs.racing.env import RacingEnv

    env = RacingEnv(num_envs=rows, curvature_ahead=[5, 15, 30])
    td = env.reset()
    td["action"] = env.action_spec.rand()
    batch = env.step(td)
    batch["next", "terminated"][::3] = True
    return batch


def on_the_racing_car(config_path: Path, root: Path) -> Path:
    """A shipped Gymnasium config of a continuous-action agent (SAC's family, TD3) moved onto the racing car, written
    under ``root`` with its run folder there: an environment whose state a checkpoint restores exactly (a Gymnasium
    task's episodes restart on loading) and a box of unequal half-ranges (throttle [−6, 4], steering ±0.44). It
    checkpoints at the end only: a greedy racing episode at the start and the end of each fit, and the throughput
    report's yardstick, would be most of a resume test's time and resume nothing."""
    config = yaml.safe_load(config_path.read_text())
    config["data"]["init_args"]["env"] = {"class_path": "envs.racing.env.RacingEnv"}
    config["data"]["init_args"]["num_envs"] = 4
    config["trainer"]["logger"]["init_args"]["save_dir"] = str(root / "runs")
    config["trainer"]["callbacks"] = [
        {"class_path": "callbacks.schedule.FrameCheckpoint", "init_args": {"every_n_frames": 10**9}}
    ]
    root.mkdir(parents=True, exist_ok=True)
    return write_config(config, root / f"{config_path.stem}_racing.yaml")


def resumed_on_the_racing_car(
    config_path: Path, root: Path, updates: int, *overrides: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """:func:`on_the_racing_car`'s run of ``config_path`` for ``updates`` updates, uninterrupted (in ``root/full``),
    and stopped halfway then resumed with ``--ckpt_path last`` and another seed (in ``root/half``): the last
    checkpoint's weights of the uninterrupted run, of the first half, and of the resumed run."""
    half = updates // 2
    fit(on_the_racing_car(config_path, root / "full"), *overrides, "--trainer.max_steps", str(updates))
    interrupted = on_the_racing_car(config_path, root / "half")
    fit(interrupted, *overrides, "--trainer.max_steps", str(half))
    (checkpoint,) = (root / "half/runs").glob("*/version_0/checkpoints/last.ckpt")
    first_half = weights(checkpoint)
    cli = fit(interrupted, *overrides, "--trainer.max_steps", str(updates), "--ckpt_path", "last", *RESEEDED)
    assert cli.trainer.global_step == updates
    assert not (checkpoint.parents[2] / "version_1").exists()  # continued in its run folder
    full = weights(root / "full" / checkpoint.relative_to(root / "half"))
    return full, first_half, weights(checkpoint)


def assert_the_bare_update_computes(model: Any, data: Any, loss: Any = None) -> None:
    """The bare reference update (callbacks/bare_updates.py) of ``model``'s agent, on its first pre-drawn batch,
    computes the total of ``loss`` (the agent's own by default) from the same random draws; and it trains: the same
    batch one pass later gives another."""
    from callbacks.bare_updates import as_replay_sample, bare_update, batch_pool

    step = bare_update(model, data)
    pool = batch_pool(data, data.batch_size)
    batch = as_replay_sample(pool[0])
    torch.manual_seed(7)  # actions, noise or points drawn inside the loss
    expected = sum(value for key, value in (loss or model.loss)(batch).items() if key.startswith("loss")).detach()
    torch.manual_seed(7)
    assert step(0) == pytest.approx(expected.item(), rel=1e-5)
    torch.manual_seed(7)
    assert step(len(pool)) != pytest.approx(expected.item(), rel=1e-5)


def assert_same(a, b, where: str = "") -> None:
    """Nested checkpoint contents (dicts, sequences, tensors, numbers) are equal, leaf by leaf."""
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}/{index}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


def fit(config_path: Path, *overrides: str):
    """``python -m app fit --config config_path overrides...`` in-process; returns the CLI (trainer, model, data)."""
    return main(["fit", "--config", str(config_path), *overrides])


def app_in_process(capsys, *args: str) -> SimpleNamespace:
    """``python -m app *args`` in this process, dispatched as ``app/__main__.py`` does; its exit status, stdout and
    stderr, as a ``subprocess.run`` result has them. For commands that stop before training (refusals,
    ``--print_config``): a process each would cost seconds of imports, and the tests that start one show that the same
    paths print nothing else."""
    capsys.readouterr()
    try:
        dispatch(list(args))
        code = 0
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    if isinstance(code, str):  # sys.exit("...") prints its message and exits 1, as the interpreter does
        err, code = f"{err}{code}\n", 1
    return SimpleNamespace(returncode=code or 0, stdout=out, stderr=err)


#: The batch of the shortened Snake fits (with ``--threads 1``) whose configs compile their update: one batch size,
#: so that they compile one graph between them (a cold compilation is seconds; Inductor's cache is on disk, shared
#: by the test processes), not one each.
SNAKE_DQN_BATCH = ("--data.init_args.batch_size", "32")
SNAKE_PPO_MINIBATCH = ("--data.init_args.minibatch_size", "32")


def short_snake_fit(config_name: str, *overrides: str):
    """A shipped Snake config (``configs/<config_name>``) run as the docs run it, shortened by ``overrides``.

    Run it in a temporary folder (``monkeypatch.chdir``): the config's CSV logger writes ``runs/<name>/version_0``
    there. The torch backend plays the same games as the default C++ kernel (``tests/envs/test_snake_env.py``) without
    its first-use compilation.
    """
    backend = ("--data.init_args.env.init_args.backend", "torch")
    return fit(ROOT / "configs" / config_name, "--threads", "1", "--trainer.max_time", "null", *backend, *overrides)


def after_each_update(model: Any, observe: Any) -> None:
    """Call ``observe(model)`` after each of ``model``'s updates, ``model.global_step`` counting it: a Lightning step
    may take several updates (``RLModule.training_step``), so per-step hooks do not see each one."""
    update = model.update

    def observed(batches: list) -> Any:
        result = update(batches)
        observe(model)
        return result

    model.update = observed


class AfterUpdate(pl.Callback):
    """A Lightning callback whose :meth:`after_update` runs after each update of the fit (:func:`after_each_update`)."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        after_each_update(pl_module, lambda model: self.after_update(model.trainer, model))

    def after_update(self, trainer: Any, pl_module: Any) -> None:
        raise NotImplementedError


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, weights_only=True)["state_dict"]


def saved_replay(checkpoint: Path, data_state: dict) -> tuple[dict, dict]:
    """The replay buffer a checkpoint keeps beside it (``FrameCheckpoint``; ``data_state`` is the data module's entry
    of the checkpoint, or a rank's state file): its written rows, read into memory, and its writer's cursor and count.

    Rows the writer has not reached yet are left out: the storage allocates them uninitialised, so they hold
    whatever the allocator handed back and differ between two runs that wrote the same data."""
    folder = Path(checkpoint).parent / data_state["buffer_folder"]
    buffer = torch.load(folder / "buffer.pt", weights_only=True)["buffer"]
    writer = {"cursor": buffer["_writer"]["_cursor"], "write_count": buffer["_writer"]["_write_count"]}
    storage = buffer["_storage"]["_storage"]  # the storage's TensorDict, its keys flattened ("next.reward")
    written = min(writer["write_count"], buffer["_storage"]["_len"])
    return {key: value[:written].clone() for key, value in storage.items() if isinstance(value, torch.Tensor)}, writer


@contextlib.contextmanager
def small_file_system(folder: Path, megabytes: int) -> Iterator[str | None]:
    """A real tmpfs of ``megabytes`` MB mounted on ``folder`` (created), unmounted on exit. Yields None once mounted,
    or why it could not be (mounting needs root and mount rights), ``folder`` then left an ordinary folder."""
    folder.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)]
    mounted = subprocess.run(command, capture_output=True)
    if mounted.returncode != 0:
        yield mounted.stderr.decode().strip() or f"mount exited with status {mounted.returncode}"
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all but ``leave`` bytes of ``disk``'s free space."""
    filler = disk / "filler"
    with open(filler, "wb") as file:
        os.posix_fallocate(file.fileno(), 0, max(os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - leave, 0))
    return filler


def assert_same_losses_and_gradients(
    model: Any, expected_loss: Any, actual_loss: Any, batch: Any, keys: set[str], gradient_atol: float = 1e-5
):
    """``actual_loss(batch)`` gives the terms ``keys``, equal to ``expected_loss(batch)``'s (a TorchRL loss module's),
    and the gradient their ``loss_*`` sum gives every trainable parameter is the same (within ``gradient_atol``);
    both from the same random draws."""
    outcomes = []
    for loss in (expected_loss, actual_loss):
        torch.manual_seed(1)
        losses = loss(batch.clone())
        model.zero_grad()
        sum(value for key, value in losses.items() if key.startswith("loss")).backward()
        gradients = [parameter.grad.clone() for parameter in model.trainable_parameters()]
        outcomes.append(({key: value.detach() for key, value in losses.items()}, gradients))
    (expected, expected_gradients), (actual, actual_gradients) = outcomes
    assert set(actual) == keys and keys <= set(expected)
    for key in keys:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-5)
    assert len(actual_gradients) == len(expected_gradients) > 0
    for actual_gradient, expected_gradient in zip(actual_gradients, expected_gradients, strict=True):
        torch.testing.assert_close(actual_gradient, expected_gradient, rtol=1e-4, atol=gradient_atol)
    return actual

"""Bare reference updates: each agent's update arithmetic in plain eager PyTorch, with no framework around it.

Each agent's reference update sits beside it (its ``reference_update(data)``: DQN and PIRL in :mod:`modules.dqn`,
PPO in :mod:`modules.ppo`, SAC in :mod:`modules.sac_reference`); this module holds what they share: the pre-drawn
batches of real transitions, the plain optimizer step, the timing, and the dispatch.

The yardstick for what the framework costs: ``ThroughputReport`` times it at the end of a run (so runs on machines
of different speed, or on different days, can be compared), and ``benchmarks/update_cost.py`` divides the whole
training loop's time per update by it. Each function copies the agent's networks and returns ``step(i)``, one update
on the ``i``-th of a few batches of real transitions drawn from the agent's environment before timing: the loss
maths written out (the same as the agent's TorchRL loss computes), backward, gradient clip and a fused Adam step.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from modules.optim import FusedAdamStep

POOL = 16  # at most this many distinct pre-drawn batches the bare loop cycles through ...
POOL_TRANSITIONS = 1024  # ... and at most this many transitions in all (Mario's are 256 KiB each, and its emulators
#                          slow to build and step: the pool is drawn at the end of a run), but 2 batches
MAX_ENVS = 16  # environments that play them: an emulator is slow to build ...
MAX_STEPS = 64  # ... unless that takes more steps than this: a step of a batched env on a GPU costs milliseconds


def transitions(data: Any, size: int, seed: int = 12_345) -> dict[str, torch.Tensor]:
    """``size`` real transitions of random play in the agent's environment, as plain tensors: ``MAX_ENVS``
    environments (more where that would take over ``MAX_STEPS`` steps), stepped and reset when done."""
    envs = min(size, max(MAX_ENVS, math.ceil(size / MAX_STEPS)))
    env = data.make_env(envs, seed)
    steps = []
    with torch.random.fork_rng(devices=[]):  # the same batch for the same seed, and the global RNG left alone
        torch.manual_seed(seed)
        td = env.reset()
        for _ in range(math.ceil(size / envs)):
            td["action"] = env.action_spec.rand()
            out, td = env.step_and_maybe_reset(td)
            steps.append(out)
    env.close()
    out = torch.cat(steps)[:size]
    return {
        "observation": out["observation"],
        "action": out["action"],
        "next_observation": out["next", "observation"],
        "reward": out["next", "reward"].view(-1),
        "terminated": out["next", "terminated"].view(-1),
    }


def batch_pool(data: Any, size: int) -> list[dict[str, torch.Tensor]]:
    """The pre-drawn batches of ``size`` transitions a bare loop cycles through (:data:`POOL` and
    :data:`POOL_TRANSITIONS` bound their number), drawn in one go by :func:`transitions`."""
    count = max(2, min(POOL, POOL_TRANSITIONS // size))
    drawn = transitions(data, size * count)
    return [{key: value[i * size : (i + 1) * size] for key, value in drawn.items()} for i in range(count)]


def optimizer_step(parameters: list[nn.Parameter], optimizer: torch.optim.Optimizer, max_grad_norm: float | None):
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_adam(parameters: list[nn.Parameter], model: Any) -> torch.optim.Optimizer:
    """The fused Adam the agent's update uses (its options: AdamW with weight decay, its ε)."""
    return model.optim.adam([{"params": parameters}])


def as_replay_sample(batch: dict[str, torch.Tensor]) -> TensorDict:
    """:func:`transitions`' plain tensors as the TensorDict a replay sample is (what the agents' losses read)."""
    flags = batch["terminated"].unsqueeze(-1)
    return TensorDict(
        {
            "observation": batch["observation"],
            "action": batch["action"],
            "next": {
                "observation": batch["next_observation"],
                "reward": batch["reward"].unsqueeze(-1),
                "done": flags,
                "terminated": flags,
            },
        },
        batch_size=[batch["reward"].shape[0]],
    )


def framework_free_update(model: Any, data: Any) -> Callable[[int], torch.Tensor]:
    """An agent's own update — its (compiled, with ``compile``) loss, backward, :class:`FusedAdamStep` and soft
    target update — with neither Lightning nor the data path around it, on the same pre-drawn batches as its bare
    update (``model.reference_update``): what the framework's update step costs before the loop around it.

    It trains ``model`` itself (a copy would not do: the TorchRL loss holds the parameters PIRL's loss reads from its
    network, and a deep copy separates the two), so pass a model built for the measurement.
    """
    if data.declared.physics is not None:
        model.physics = data.declared.physics  # what PIRL's setup takes from the data module
    # The function the agent's update compiles (SAC's own, with its term towards the clone), and PIRL's loss inputs.
    loss = model.compiled(model.training_loss() if hasattr(model, "training_loss") else model.loss)
    loss_inputs = getattr(model, "loss_draws", lambda batch: {})
    optimizer = make_adam(model.trainable_parameters(), model)
    optimizer_step = FusedAdamStep(optimizer, model.optim.max_grad_norm)
    batches = [as_replay_sample(batch) for batch in batch_pool(data, data.batch_size)]

    def step(i: int) -> torch.Tensor:
        batch = batches[i % len(batches)]
        total = sum(value for key, value in loss(batch, **loss_inputs(batch)).items() if key.startswith("loss"))
        total.backward()
        optimizer_step()
        if model.target_networks and getattr(model, "target_update", "soft") == "soft":
            model.soft_update()
        return total.detach()

    return step


def time_bare(step: Callable[[int], Any], seconds: float) -> float:
    """Seconds per call of ``step``: the median of 5 runs sharing ``seconds`` (each at least one call), after a
    warm-up of 20 calls or ``seconds`` (at least 2 calls: an update of the Mario CNN takes seconds on a CPU)."""

    def sync() -> None:  # GPU work is asynchronous: a run ends when its kernels have
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    start = time.perf_counter()
    for i in range(20):
        step(i)
        if i >= 1 and time.perf_counter() - start > seconds:
            break
    runs = []
    for _ in range(5):
        sync()
        calls, start = 0, time.perf_counter()
        while calls == 0 or time.perf_counter() - start < seconds / 5:
            step(calls)
            calls += 1
        sync()
        runs.append((time.perf_counter() - start) / calls)
    return statistics.median(runs)


def bare_update(model: Any, data: Any) -> Callable[[int], torch.Tensor] | None:
    """The bare reference update of ``model``'s agent (its ``reference_update``, beside the agent: DQN and PIRL in
    :mod:`modules.dqn`, PPO in :mod:`modules.ppo`, SAC in :mod:`modules.sac_reference`), or None for an agent without
    one."""
    reference = getattr(model, "reference_update", None)  # RLModule's; behaviour cloning has none
    return None if reference is None else reference(data)


def bare_update_ms(model: Any, data: Any, seconds: float) -> float | None:
    """Milliseconds per bare reference update of ``model`` on this machine now, on one thread (None when its family
    has none).

    One thread whatever the run uses: the yardstick must not depend on what else the other cores are doing (with two
    threads, an update of the Snake MLP ran several times slower than on one while another process held the second
    core).
    Runs on copies of the networks, on the data module's device, where the run's batches live (by ``on_fit_end``,
    where the throughput report calls this, Lightning has already moved the model back to the CPU); the model is left
    untouched.
    """
    step = bare_update(model, data)
    if step is None:
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return 1e3 * time_bare(step, seconds)
    finally:
        torch.set_num_threads(threads)

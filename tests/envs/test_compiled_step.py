"""``compile_step``: the environments whose step is tensor arithmetic, compiled into one graph each for step and
reset, play what their eager step plays (Snake to the bit; the float dynamics within rounding), and the compiled Snake
step reads nothing back to the host, counted as ``benchmarks/env_speed.py --count-ops`` counts it for the results page
and the GPU suite (whose quick mode compiles no step: one compilation of each in the suite, here)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from envs.racing.env import RacingEnv
from envs.safety.toy import ToyEnv
from envs.safety.vehicle import VehicleEnv
from envs.snake.env import SnakeEnv
from tests.helpers import benchmark_module

env_speed = benchmark_module("env_speed")

# Short episodes, so that resets and crashes happen within the steps below.
CASES = {
    # Boards of 16 cells: the food draw's 16 candidates cover the board, with many free ones tied, where an argmax
    # compiled for the CPU once picked another candidate than the eager one (the draw now reduces distinct values).
    "snake": (SnakeEnv, {"size": 4, "max_steps": 30, "backend": "torch"}),
    "vehicle": (VehicleEnv, {}),
    "toy": (ToyEnv, {}),
    "racing": (
        RacingEnv,
        {
            "observation": "road",
            "max_steps": 40,
            "tracks": {"generator": {}, "per": "episode", "pool": 4},
            "speed_limiter": {},
        },
    ),
}


def random_actions(env, steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    space = env.action_spec.space
    if env.action_spec.dtype.is_floating_point:
        low, high = space.low, space.high
        return [low + (high - low) * torch.rand(low.shape, generator=generator) for _ in range(steps)]
    return [torch.randint(0, space.n, env.batch_size, generator=generator) for _ in range(steps)]


def operations_per_step(env, tensordict, actions: list[torch.Tensor]) -> dict[str, float]:
    """ATen operations, host reads and compiled graphs per step of ``env`` from ``tensordict``, counted by
    ``benchmarks/env_speed.py --count-ops``'s own counter."""

    def step(action: torch.Tensor) -> None:
        nonlocal tensordict
        tensordict["action"] = action
        _, tensordict = env.step_and_maybe_reset(tensordict)

    return env_speed.count_operations(step, actions)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_compiled_step_plays_what_the_eager_step_plays(case):
    cls, options = CASES[case]
    graphs_before = counters["stats"]["unique_graphs"]
    eager, compiled = (cls(num_envs=32, seed=5, compile_step=flag, **options) for flag in (False, True))
    assert eager.skips_idle_work and not compiled.skips_idle_work
    exact = cls is SnakeEnv  # integer rules; the float dynamics are fused by the compiler, so equal up to rounding
    inputs = [eager.reset(), compiled.reset()]
    resets = 0
    for action in random_actions(eager, 120):
        outputs = []
        for index, env in enumerate((eager, compiled)):
            inputs[index]["action"] = action.clone()
            out, inputs[index] = env.step_and_maybe_reset(inputs[index])
            outputs.append(out)
        for key in outputs[0].keys(True, True):
            a, b = outputs[0][key], outputs[1][key]
            if exact or not a.dtype.is_floating_point:
                assert torch.equal(a, b), (case, key)
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)
        resets += int(outputs[0]["next", "done"].sum())
    assert resets > 0  # the masked reset ran where rows finished
    # Two graphs, the step's and the masked reset's: the whole batch's first reset runs once, and stays eager.
    assert counters["stats"]["unique_graphs"] - graphs_before == 2
    for name, a in eager.state_dict().items():
        b = compiled.state_dict()[name]
        if cls is SnakeEnv and name in ("board", "trail"):  # the last column is a write-only scratch slot
            a, b = a[:, :-1], b[:, :-1]
        if exact or not a.dtype.is_floating_point:
            assert torch.equal(a, b), (case, name)
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)
    if cls is SnakeEnv:
        # The eager step reads its masks back to skip idle work (on a GPU, a synchronisation each); compiled, it reads
        # nothing, runs fewer ATen operations, and is one graph for the step and one for the masked reset, every step.
        actions = random_actions(eager, 3)
        counted = [operations_per_step(env, td, actions) for env, td in zip((eager, compiled), inputs, strict=True)]
        assert counted[1]["host_reads"] == 0 < counted[0]["host_reads"]
        assert counted[1]["aten_ops"] < counted[0]["aten_ops"]
        assert counted[1]["compiled_graphs"] == 2 and counted[0]["compiled_graphs"] == 0


def test_the_compiled_snake_needs_the_torch_backend():
    with pytest.raises(ValueError, match="^compile_step compiles the torch backend"):
        SnakeEnv(num_envs=2, backend="cpp", compile_step=True)


def test_the_compiled_random_bits_are_the_eager_ones():
    """Compiled, the slots' keys come from a constant table (an arange's arithmetic did not compile for a GPU); the
    bits must be the eager arange's, for every slot offset the environments use."""
    from envs.counter_rng import random_bits

    stream, draws = torch.arange(6) + 11, torch.arange(6) * 7
    compiled = torch.compile(random_bits, fullgraph=True, dynamic=False)
    for slots, first_slot in ((4, 0), (6, 16), (3, 40)):
        assert torch.equal(compiled(stream, draws, slots, first_slot), random_bits(stream, draws, slots, first_slot))

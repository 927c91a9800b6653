"""MettaGrid (the ``mettagrid`` package's compiled multi-agent grid world) as a batched TorchRL environment.

**Batch.** ``[num_envs, num_agents]``: every agent of every environment is one row, all acting through one shared
policy. Keys: ``observation`` uint8 ``[num_envs, num_agents, num_tokens, 3]``, ``action`` int64 (5 actions: noop,
move north, south, west, east), ``reward`` float32 and ``done``/``terminated``/``truncated`` bool, each
``[num_envs, num_agents, 1]``.

**Observation.** MettaGrid's tokens: ``[location, feature id, value]`` with ``location = row << 4 | col`` in the
agent's 13×13 egocentric view (the agent at row 6, col 6), ``0xFE`` for agent-wide tokens (episode completion,
last action, last reward) and ``0xFF`` in all three bytes for padding after the last token.
:attr:`MettaGridEnv.observation_layout` names the features and gives their normalisation. Object types are a
``tag`` feature whose value is the type's tag id; an unused first tag keeps every id > 0, so no object is a zero.

**Tasks.** ``altars`` (the default): hearts are the reward (+1 each). An altar gives a heart to the agent that
walks into it when it is charged: its ``energy`` refills by 1 per step up to ``altar_cooldown`` and a use empties
it, so an altar gives at most one heart per ``altar_cooldown`` steps. Agents see each altar's energy, and their own
hearts, in their tokens. Random agents collect a few hearts per episode; a scripted walk to the nearest charged
altar earns several times more (docs/results/mettagrid.md, "Baselines"). ``arena``: the package's stock
``make_arena`` (walls only), which gives no reward at all.

**Episodes** last ``max_steps`` steps (truncated; MettaGrid has no other ending here, so all agents of an
environment end together) and each environment restarts on its own. 500 steps is long enough for an agent to
cross the map a few times and short enough for several episodes per minute of CPU training and for evaluation to
stay cheap (one episode is 500 × 24 agent-steps).

**Seeding.** Episode ``k`` of environment ``i`` in a batch seeded ``seed`` uses the map and engine seed
:func:`~envs.counter_rng.episode_seed` ``(seed + i, k)``: a batch replays exactly the games of single
environments seeded ``seed + i`` under the same actions.

**State.** The C++ engine cannot be saved, so ``state_dict`` holds, per environment, the seed of the running
episode and every action taken since its start; loading rebuilds the episode and replays them (at most
``max_steps`` engine steps per environment). In a ``ParallelEnv``, ``penv.env_state()`` lists the workers' states
(``penv.state_dict()`` gives them too) and ``penv[w].load_env_state(state)`` restores worker ``w``.
Not ``penv.load_state_dict``: in torchrl 0.14.1 it leaves the workers' shared-memory "done" flags set, and the next
step returns before the workers have written it (the parent reads stale observations).
"""

from __future__ import annotations

import zlib
from typing import Any

import mettagrid.config.mettagrid_c_config as cpp_config
import numpy as np
import torch
from mettagrid.builder import building
from mettagrid.builder.envs import make_arena
from mettagrid.config.game_value import InventoryValue
from mettagrid.config.handler_config import Handler, targetHas, updateActor, updateTarget
from mettagrid.config.mettagrid_config import (
    ActionsConfig,
    AgentConfig,
    ChangeVibeActionConfig,
    GameConfig,
    GridObjectConfig,
    InventoryConfig,
    MoveActionConfig,
    NoopActionConfig,
    ResourceLimitsConfig,
)
from mettagrid.config.mutation import queryDelta
from mettagrid.config.query import query
from mettagrid.config.reward_config import reward
from mettagrid.config.tag import typeTag
from mettagrid.mapgen.mapgen import MapGen
from mettagrid.mapgen.scenes.random import Random
from mettagrid.mettagrid_c import MettaGrid
from tensordict import TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from checkpoints.files import CheckpointMismatch
from compat.tensordict import tensordict_unchecked
from compat.torchrl import StepOutputComplete
from envs.base import BatchedEnv
from envs.counter_rng import episode_seed
from envs.drawing import grid_image, palette
from envs.tokens import ObservationLayout

# Objects each task places on its map by default (the ``objects`` option overrides counts by name).
TASK_OBJECTS = {"altars": {"wall": 10, "altar": 20}, "arena": {"wall": 10}}
# Walls around the play area, as wide as the view's radius: an agent at the edge sees walls, never off-map cells.
BORDER = 6
# Sorts before every ``type:*`` tag, so real tag ids start at 1 and no object type is encoded as a zero value.
_UNUSED_TAG = "_unused"
_CPU = torch.device("cpu")
#: ``render``'s colours: floor, wall, agent, charged altar, recharging altar, any other object (their colour ids).
RENDER_COLOURS = palette((28, 28, 34), (110, 110, 122), (60, 140, 250), (250, 200, 40), (110, 80, 30), (200, 60, 200))
FLOOR, WALL, AGENT, ALTAR, ALTAR_RECHARGING, OTHER = range(6)
#: pixels per map cell in ``render``.
RENDER_CELL = 12


def altars_game(num_agents: int, altar_cooldown: int) -> GameConfig:
    """Hearts from altars that recharge one energy per step, up to ``altar_cooldown``; a use takes all of it."""
    full = {"energy": altar_cooldown}
    limit = ResourceLimitsConfig(base=altar_cooldown, resources=["energy"])
    altar = GridObjectConfig(
        name="altar",
        inventory=InventoryConfig(initial=full, limits={"energy": limit}),
        on_use_handler=Handler(
            filters=[targetHas(full)], mutations=[updateTarget({"energy": -altar_cooldown}), updateActor({"heart": 1})]
        ),
    )
    return GameConfig(
        num_agents=num_agents,
        resource_names=["heart", "energy"],
        # A game-level tick handler: an object's own area effect (effect_self) does not reach it in 0.26.22.
        on_tick=Handler(mutations=[queryDelta(query(typeTag("altar")), {"energy": 1})]),
        actions=ActionsConfig(
            noop=NoopActionConfig(), move=MoveActionConfig(), change_vibe=ChangeVibeActionConfig(enabled=False)
        ),
        objects={"wall": building.wall, "altar": altar},
        agent=AgentConfig(
            # No cap that a long episode could reach: the reward is the change of the heart count.
            inventory=InventoryConfig(limits={"heart": ResourceLimitsConfig(base=65535, resources=["heart"])}),
            rewards={"heart": reward(InventoryValue(item="heart"))},
        ),
    )


class MettaGridEnv(StepOutputComplete, BatchedEnv):
    """Batched MettaGrid: ``num_envs`` engines of ``num_agents`` agents each, stepped one after the other.

    Args:
        num_envs: environments stepped together.
        task: ``altars`` (hearts from recharging altars; the default) or ``arena`` (stock ``make_arena``, no reward).
        num_agents: agents per environment.
        map_width, map_height: the play area in cells, inside a ring of walls ``BORDER`` cells wide.
        objects: object counts placed at random on the play area, by name, over the task's defaults
            (``TASK_OBJECTS``: altars 20 altars and 10 walls; arena 10 walls).
        altar_cooldown: steps an altar needs to recharge after a use (``altars``).
        max_steps: episode length (all agents are truncated together).
        num_tokens: observation tokens per agent. MettaGrid lists tokens nearest first and drops those beyond
            ``num_tokens``; random play of the default task stays well below 200 (docs/results/mettagrid.md, "Figures
            quoted in code"), so 200 keeps every token in two fifths of the memory of MettaGrid's default of 500.
        seed: base seed; environment ``i`` plays the episodes of stream ``seed + i``.
        device: where the returned tensors live (the engines run on the CPU).
    """

    can_render = True

    def __init__(
        self,
        num_envs: int = 1,
        task: str = "altars",
        num_agents: int = 24,
        map_width: int = 25,
        map_height: int = 25,
        objects: dict[str, int] | None = None,
        altar_cooldown: int = 10,
        max_steps: int = 500,
        num_tokens: int = 200,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        # Messages start with the argument's name: the command line prefixes the flag path it was given under.
        for name, value in (("num_envs", num_envs), ("num_agents", num_agents), ("max_steps", max_steps)):
            if value < 1:
                raise ValueError(f"{name} must be > 0, got {value}")
        for name, value in (("altar_cooldown", altar_cooldown), ("num_tokens", num_tokens)):
            if value < 1:
                raise ValueError(f"{name} must be > 0, got {value}")
        if task not in TASK_OBJECTS:
            raise ValueError(f"task must be one of {', '.join(TASK_OBJECTS)}, got {task!r}")
        counts = {**TASK_OBJECTS[task], **(objects or {})}
        for name, count in counts.items():
            if name not in TASK_OBJECTS[task]:
                known = ", ".join(TASK_OBJECTS[task])
                raise ValueError(f"objects names {name!r}, which task {task!r} does not have (it has {known})")
            if count < 0:
                raise ValueError(f"objects must count each object >= 0, got {name}: {count}")
        if map_width < 1 or map_height < 1:
            raise ValueError(f"map_width and map_height must be > 0, got {map_width}x{map_height}")
        if num_agents + sum(counts.values()) > map_width * map_height:
            raise ValueError(
                f"map_width x map_height ({map_width}x{map_height} = {map_width * map_height} cells) cannot hold "
                f"{num_agents} agents and {sum(counts.values())} objects"
            )
        super().__init__(batch_size=torch.Size([num_envs, num_agents]), device=device)
        self.task, self.num_agents, self.map_width, self.map_height = task, num_agents, map_width, map_height
        self.objects, self.altar_cooldown = counts, altar_cooldown
        self.max_steps, self.num_tokens = max_steps, num_tokens

        game = altars_game(num_agents, altar_cooldown) if task == "altars" else make_arena(num_agents).game
        game.tags = [*game.tags, _UNUSED_TAG]
        game.max_steps, game.episode_truncates, game.obs.num_tokens = max_steps, True, num_tokens
        game.map_builder = MapGen.Config(
            num_agents=num_agents,
            width=map_width,
            height=map_height,
            border_width=BORDER,
            instance_border_width=0,
            instance=Random.Config(agents=num_agents, objects=counts),
        )
        self._config_crc = zlib.crc32(game.model_dump_json().encode())  # a checkpoint must match the game
        features = sorted(game.id_map().features(), key=lambda feature: feature.id)
        self.observation_layout = ObservationLayout(
            height=game.obs.height,
            width=game.obs.width,
            feature_names=tuple(feature.name for feature in features),
            normalization=tuple(feature.normalization for feature in features),
            tag_names=tuple(game.id_map().tag_names()),
        )
        self._map_builder = game.map_builder
        self.num_actions = len(game.actions.actions())
        self._cpp_config, self._agent_renames = cpp_config.convert_to_cpp_game_config(game)  # (this edits `game`)

        # The engines write into slices of these arrays: one array per kind for the whole batch, seen by torch.
        n, shape = num_envs, (num_envs, num_agents)
        self._obs = np.full((*shape, num_tokens, game.obs.token_dim), 0xFF, dtype=np.uint8)
        self._terminals, self._truncations = np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)
        self._rewards, self._actions = np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=np.int32)
        self._engines: list[MettaGrid | None] = [None] * n
        # Replay state: each environment's running episode (its seed, -1: none) and the actions since it started.
        # NumPy, like the buffers: per step its calls on these small arrays cost a fraction of torch's.
        self._stream = np.arange(n, dtype=np.int64) + seed
        self._next_episode = np.zeros(n, dtype=np.int64)
        self._episode_seed = np.full(n, -1, dtype=np.int64)
        self._steps = np.zeros(n, dtype=np.int64)
        self._log = np.zeros((n, max_steps, num_agents), dtype=np.uint8)
        self._env_index = np.arange(n)
        self._render_walls: dict[int, tuple[tuple[int, int], np.ndarray]] = {}  # render's: {env: ((env, seed), walls)}

        dev = self.device
        self.observation_spec = Composite(
            observation=Bounded(0, 255, shape=self._obs.shape, dtype=torch.uint8, device=dev), shape=shape, device=dev
        )
        self.action_spec = Categorical(self.num_actions, shape=shape, device=dev)
        self.reward_spec = Unbounded(shape=(*shape, 1), device=dev)

    # ------------------------------------------------------------------------------------------- episodes
    def _engine_buffers(self, env: int | slice) -> tuple[np.ndarray, ...]:
        """Environment ``env``'s observations, terminals, truncations, rewards and actions (``set_buffers`` order)."""
        return tuple(a[env] for a in (self._obs, self._terminals, self._truncations, self._rewards, self._actions))

    def _start(self, env: int, seed: int) -> MettaGrid:
        """Build environment ``env``'s episode with map and engine seed ``seed``, writing into its buffer slices."""
        grid = self._map_builder.model_copy(update={"seed": seed}).create().build_for_num_agents(self.num_agents)
        cells = grid.grid.tolist()
        if self._agent_renames:
            cells = cpp_config.rename_map_agents(cells, self._agent_renames)
        engine = MettaGrid(self._cpp_config, cells, seed)
        # Copies the first observation and cleared flags into the slices.
        engine.set_buffers(*self._engine_buffers(env))
        self._engines[env] = engine
        self._episode_seed[env], self._steps[env] = seed, 0
        return engine

    def _restart(self, envs: list[int]) -> None:
        for env in envs:
            self._start(env, episode_seed(int(self._stream[env]), int(self._next_episode[env])))
            self._next_episode[env] += 1

    def _output(self, reward: bool) -> TensorDictBase:
        """Copies of the buffers (the engines overwrite them at the next step), as the spec's entries.

        Made with NumPy and assembled without TensorDict's per-entry checks, which the entries pass by construction:
        this is most of what the wrapper adds to a step (the issue's budget is 15 % of the raw engines' time).
        """
        terminated, truncated = self._terminals[..., None].copy(), self._truncations[..., None].copy()
        out = {
            "observation": torch.from_numpy(self._obs.copy()),
            "terminated": torch.from_numpy(terminated),
            "truncated": torch.from_numpy(truncated),
            "done": torch.from_numpy(terminated | truncated),
        }
        if reward:
            out["reward"] = torch.from_numpy(self._rewards[..., None].copy())
        data = tensordict_unchecked(out, self.batch_size, _CPU)
        return data if self.device == _CPU else data.to(self.device)

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        """Restart the flagged environments (all, without ``_reset``) and those never started.

        An environment restarts when any of its agents is flagged; the flags are widened in place to all its agents,
        so TorchRL's masked merge takes every agent's fresh entries (MettaGrid's agents end their episodes together,
        so a done mask never flags only some agents of an environment).
        """
        flags = None if tensordict is None else tensordict.get("_reset", None)
        if flags is None:
            self._restart(list(range(self.batch_size[0])))
            return self._output(reward=False)
        per_env = flags.reshape(self.batch_size[0], -1).any(-1).cpu() | torch.from_numpy(self._episode_seed < 0)
        widened = per_env.to(flags.device).view(-1, *([1] * (flags.dim() - 1))).expand_as(flags)
        if not torch.equal(flags, widened):
            flags.copy_(widened)
        self._restart(per_env.nonzero().flatten().tolist())
        return self._output(reward=False)

    def maybe_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Restart the finished environments; every entry is replaced by ``_reset``'s (current for the others), which
        spares TorchRL's per-key masked merge."""
        done = tensordict.get("done")
        if done.any():
            self._restart(done.reshape(self.batch_size[0], -1).any(-1).nonzero().flatten().tolist())
            tensordict.update(self._output(reward=False))
        return tensordict

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        steps = self._steps
        if self._episode_seed.min() < 0:
            raise RuntimeError("MettaGridEnv: reset the environment before stepping it")
        if steps.max() >= self.max_steps:
            env = int(steps.argmax())
            raise RuntimeError(f"MettaGridEnv: environment {env} finished its episode; reset it before stepping it")
        self._actions[:] = tensordict.get("action").reshape(self.batch_size).cpu().numpy()  # int64 → int32
        self._log[self._env_index, steps] = self._actions
        for engine in self._engines:
            engine.step()
        steps += 1
        return self._output(reward=True)

    def render(self, index: int = 0) -> np.ndarray:
        """Environment ``index``'s whole map, ``RENDER_CELL`` pixels a cell in ``RENDER_COLOURS``: walls, agents, and
        altars bright when charged (they give a heart) and dim while recharging."""
        engine = self._engines[self._render_index(index)]
        if engine is None:
            raise RuntimeError("MettaGridEnv: reset the environment before rendering it")
        key = (index, int(self._episode_seed[index]))
        if self._render_walls.get(index, (None,))[0] != key:  # walls never move: read once per episode
            walls = np.zeros((engine.map_height, engine.map_width), dtype=np.int64)
            for cell in engine.grid_objects().values():
                if cell["type_name"] == "wall":
                    walls[cell["r"], cell["c"]] = WALL
            self._render_walls[index] = (key, walls)
        ids = self._render_walls[index][1].copy()
        energy = engine.resource_names.index("energy") if "energy" in engine.resource_names else None
        for cell in engine.grid_objects(ignore_types=["wall"]).values():
            kind = cell["type_name"]
            if kind == "agent":
                colour = AGENT
            elif kind == "altar":
                charged = energy is None or cell["inventory"].get(energy, 0) >= self.altar_cooldown
                colour = ALTAR if charged else ALTAR_RECHARGING
            else:
                colour = OTHER
            ids[cell["r"], cell["c"]] = colour
        return grid_image(ids, RENDER_COLOURS, RENDER_CELL)

    def _set_seed(self, seed: int | None) -> None:
        """Environment ``i`` starts stream ``seed + i`` from its first episode at its next reset."""
        self._stream = np.arange(self.batch_size[0], dtype=np.int64) + (0 if seed is None else seed)
        self._next_episode[:] = 0

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Release the engines (a later reset builds new ones)."""
        self._engines = [None] * self.batch_size[0]
        self._episode_seed[:], self._steps[:] = -1, 0
        super().close(raise_if_closed=raise_if_closed)

    # ---------------------------------------------------------------------------------------------- state
    def env_state(self) -> dict[str, Any]:
        """This environment's state (what ``state_dict`` saves): ``penv.env_state()`` lists every worker's."""
        return self.get_extra_state()

    def load_env_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`env_state`'s result; ``penv[w].load_env_state(state)`` restores ParallelEnv worker ``w``."""
        self.set_extra_state(state)

    def get_extra_state(self) -> dict[str, Any]:
        """Plain tensors and ints (``torch.load(weights_only=True)`` reads them): seeds, episode counters, and the
        actions of the running episodes (uint8 ``[num_envs, longest, num_agents]``)."""
        longest = int(self._steps.max())
        return {
            "config_crc": self._config_crc,
            "stream": torch.from_numpy(self._stream.copy()),
            "next_episode": torch.from_numpy(self._next_episode.copy()),
            "episode_seed": torch.from_numpy(self._episode_seed.copy()),
            "steps": torch.from_numpy(self._steps.copy()),
            "actions": torch.from_numpy(self._log[:, :longest].copy()),
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Rebuild each running episode from its seed and replay its actions: ``steps`` engine steps per env."""
        n, actions = self.batch_size[0], state["actions"]
        if state["stream"].shape != (n,) or actions.shape[2] != self.num_agents:
            raise CheckpointMismatch(
                f"its environment state is for {state['stream'].shape[0]} environments of {actions.shape[2]} "
                f"agents; this run's has {n} of {self.num_agents}"
            )
        if state["config_crc"] != self._config_crc or actions.shape[1] > self.max_steps:
            raise CheckpointMismatch("its environment state is for another game (task, map, objects or max_steps)")
        self._stream, self._next_episode = state["stream"].numpy().copy(), state["next_episode"].numpy().copy()
        actions = actions.numpy()
        self._log[:] = 0
        self._log[:, : actions.shape[1]] = actions
        for env in range(n):
            seed, steps = int(state["episode_seed"][env]), int(state["steps"][env])
            if seed < 0:
                self._engines[env], self._episode_seed[env], self._steps[env] = None, -1, 0
                continue
            engine = self._start(env, seed)
            for action in actions[env, :steps]:
                self._actions[env] = action
                engine.step()
            self._steps[env] = steps

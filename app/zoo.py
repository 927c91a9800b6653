"""``lightrl zoo``: the RL Zoo's tuned hyperparameters for an (algorithm, environment) pair, written as the lightrl
config that means the same.

    lightrl zoo --algo dqn --env CartPole-v1 --out cartpole_dqn.yaml
    python -m app zoo --algo dqn --env Acrobot-v1 --out acrobot_dqn.yaml && python -m app fit --config acrobot_dqn.yaml

It reads ``hyperparams/<algo>.yml`` from the installed ``rl_zoo3`` package (the ``zoo`` extra: never needed to
train) and writes every mapped field with the Zoo's name beside it. A key it cannot map (an option lightrl lacks, a
wrapper or an image policy other than the Atari entries') stops it with one line naming each such key and why: a
config that silently meant something else would mislead the comparison it exists for. ``configs/gym/cartpole_dqn.yaml``
and ``lunarlander_dqn.yaml`` are this command's output, as are the other RL Zoo configs in ``configs/gym/``
(``SHIPPED`` in tests/app/test_zoo.py).

How the Zoo's numbers become lightrl's (Stable-Baselines3's defaults for the keys an entry leaves out). DQN:

- a round is what Stable-Baselines3 collects between two trainings, ``train_freq × n_envs`` frames, and trains on it
  ``gradient_steps`` updates (``-1``: one per environment step, ``train_freq``); lightrl collects the same frames per
  round from the Zoo's ``n_envs`` copies (``num_envs``; ``--copies N``: N copies stepped together dividing the
  round, faster on a batched environment but not Stable-Baselines3's episodes: docs/guide/zoo.md) and sets
  ``frames_per_update`` to the round's frames over its updates;
- a round of more than 64 updates of batches of at most 64 samples becomes half the updates of twice the batch: the
  same samples per frame, for about half the cost, where each update costs little more than its launch (lightrl
  differs here on purpose, chosen by measurement on CartPole: docs/systems/gymnasium.md; ``--exact-updates`` keeps
  the Zoo's);
- ``target_update_interval`` counts frames. Shorter than a round, the copies happen while collecting, when the network
  does not change: once a round in effect, so every round's updates. Else every interval's updates;
- ``exploration_fraction`` of ``n_timesteps`` is the ε schedule's frames; ``learning_starts`` the warm-up frames;
  ``lin_X`` learning rates decay linearly from X to 0 over ``n_timesteps``;
- the budget, ``n_timesteps`` frames, is ``max_steps`` updates after the warm-up; runs of more than 50,000 updates
  compile their update (not on images).

PPO: a rollout of ``n_steps`` from each of ``n_envs`` copies, ``n_epochs`` passes of minibatches of ``batch_size``;
the budget is the whole rollouts that fit in ``n_timesteps``; ``clip_range: lin_X`` falls linearly to 0 over it;
``normalize`` (VecNormalize) is the running normalisation of observations and rewards; ``log_std_init`` the Gaussian's
initial scale; Stable-Baselines3's policy defaults (64-64 tanh MLPs, orthogonal initialisation, Adam's ε 1e-5, the
squared-error value loss) are written out. Runs of more than 50,000 updates compile their update.

SAC: rounds, warm-up and budget as DQN's; the buffer at most the run's frames; ``ent_coef: auto``/``auto_X`` as α
learned from 1/X; actor and critics of ``net_arch``. TQC: SAC's, with ``n_quantiles`` and
``top_quantiles_to_drop_per_net``. CrossQ: SAC's without target networks, with ``policy_delay`` and the batch
renormalisation's ``batch_norm_momentum`` and ``renorm_warmup_steps``. TD3: as SAC's, with ``noise_type: normal``'s
``noise_std`` as the acting noise and Stable-Baselines3's target policy smoothing and policy delay.

Atari: the Zoo's ``atari`` entry of DQN, QR-DQN, PPO and A2C, for any game whose registered entry point is ale-py's
``AtariEnv`` (as the Zoo chooses it): ``env_wrapper`` AtariWrapper as Gymnasium's wrappers and ``episodic_life``
(:func:`atari_environment`), ``frame_stack`` stacked, ``CnnPolicy`` the Nature CNN (``network: {kind: auto}``),
``optimize_memory_usage`` the replay's frames kept once (the same samples), A2C's ``RMSpropTFLike`` TensorFlow's
RMSprop (``rmsprop_tf``); evaluations of whole games, two threads, never compiled.

All: greedy evaluations every tenth of the budget, checkpoints every fifth; logging every 100 updates below 10,000
updates, else 500.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Stable-Baselines3's defaults (its classes' __init__, 2.x) for the keys an entry leaves out; ``policy_kwargs`` as
#: its policies' defaults (DQN's QNetwork: ReLU; PPO's ActorCriticPolicy: Tanh, orthogonal initialisation).
SB3_DEFAULTS = {
    "dqn": {
        "learning_rate": 1e-4,
        "buffer_size": 1_000_000,
        "learning_starts": 100,
        "batch_size": 32,
        "tau": 1.0,
        "gamma": 0.99,
        "train_freq": 4,
        "gradient_steps": 1,
        "target_update_interval": 10_000,
        "exploration_fraction": 0.1,
        "exploration_initial_eps": 1.0,
        "exploration_final_eps": 0.05,
        "max_grad_norm": 10.0,
        "n_envs": 1,
        "policy_kwargs": "dict(net_arch=[64, 64], activation_fn=nn.ReLU)",
    },
    "a2c": {
        "learning_rate": 7e-4,
        "n_steps": 5,
        "gamma": 0.99,
        "gae_lambda": 1.0,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "rms_prop_eps": 1e-5,
        "use_rms_prop": True,
        "normalize_advantage": False,
        "n_envs": 1,
        "policy_kwargs": "dict(net_arch=[64, 64], activation_fn=nn.Tanh, ortho_init=True)",
    },
    "ppo": {
        "learning_rate": 3e-4,
        "n_steps": 2048,
        "batch_size": 64,
        "n_epochs": 10,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "clip_range": 0.2,
        "normalize_advantage": True,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "n_envs": 1,
        "policy_kwargs": "dict(net_arch=[64, 64], activation_fn=nn.Tanh, ortho_init=True)",
    },
    "sac": {
        "learning_rate": 3e-4,
        "buffer_size": 1_000_000,
        "learning_starts": 100,
        "batch_size": 256,
        "tau": 0.005,
        "gamma": 0.99,
        "train_freq": 1,
        "gradient_steps": 1,
        "ent_coef": "auto",
        "target_update_interval": 1,
        "target_entropy": "auto",
        "n_envs": 1,
        "policy_kwargs": "dict(net_arch=[256, 256], activation_fn=nn.ReLU, n_critics=2)",
    },
    "td3": {
        "learning_rate": 1e-3,
        "buffer_size": 1_000_000,
        "learning_starts": 100,
        "batch_size": 256,
        "tau": 0.005,
        "gamma": 0.99,
        "train_freq": 1,
        "gradient_steps": 1,
        "policy_delay": 2,
        "target_policy_noise": 0.2,
        "target_noise_clip": 0.5,
        "n_envs": 1,
        "policy_kwargs": "dict(net_arch=[400, 300], activation_fn=nn.ReLU)",
    },
}
#: DDPG: Stable-Baselines3's TD3 class without its tricks (one critic, no target smoothing, no delay).
SB3_DEFAULTS["ddpg"] = {
    key: value
    for key, value in SB3_DEFAULTS["td3"].items()
    if key not in ("policy_delay", "target_policy_noise", "target_noise_clip")
}
#: sb3-contrib's QR-DQN: DQN's defaults but these.
SB3_DEFAULTS["qrdqn"] = {
    **SB3_DEFAULTS["dqn"],
    "learning_rate": 5e-5,
    "exploration_fraction": 0.005,
    "exploration_final_eps": 0.01,
    "max_grad_norm": None,
    "policy_kwargs": "dict(net_arch=[64, 64], activation_fn=nn.ReLU, n_quantiles=200)",
}
#: sb3-contrib's TQC: SAC's defaults and its quantile critics.
SB3_DEFAULTS["tqc"] = {
    **SB3_DEFAULTS["sac"],
    "top_quantiles_to_drop_per_net": 2,
    "policy_kwargs": "dict(net_arch=[256, 256], activation_fn=nn.ReLU, n_quantiles=25, n_critics=2)",
}
#: sb3-contrib's CrossQ: SAC's without target networks, with batch renormalisation and a delayed actor.
SB3_DEFAULTS["crossq"] = {
    **{key: value for key, value in SB3_DEFAULTS["sac"].items() if key not in ("tau", "target_update_interval")},
    "learning_rate": 1e-3,
    "policy_delay": 3,
    "policy_kwargs": (
        "dict(net_arch=dict(pi=[256, 256], qf=[1024, 1024]), activation_fn=nn.ReLU, n_critics=2, "
        "batch_norm_momentum=0.01, renorm_warmup_steps=100000)"
    ),
}
#: Above this many updates a round, DQN's updates of at most this batch are merged in pairs (module docstring).
MERGED_UPDATES = 64
#: Runs of more updates than this compile their update: the compilation (seconds) is then a small share.
COMPILE_ABOVE_UPDATES = 50_000
#: Keys read for every algorithm and needing nothing: the policy class is checked on its own.
_READ = {"n_timesteps", "policy"}
_ACTIVATIONS = {"ReLU": "relu", "Tanh": "tanh"}
#: The wrapper the Zoo's ``atari`` entries name (``env_wrapper``), which the command writes as Gymnasium's wrappers.
ATARI_WRAPPER = "stable_baselines3.common.atari_wrappers.AtariWrapper"
#: The game the coverage maps each ``atari`` entry on (the entry is the Zoo's for every Atari game: one pair).
ATARI_EXAMPLE = "BreakoutNoFrameskip-v4"
#: The side of AtariWrapper's square grey frames (its ``screen_size``).
ATARI_SCREEN = 84
#: ``policy_kwargs`` ``optimizer_class`` values mapped: lightrl's ``model.optimizer.algorithm`` for each.
OPTIMIZER_CLASSES = {"RMSpropTFLike": "rmsprop_tf"}


def display_name(algo: str) -> str:
    """An algorithm as the config's header and the refusals write it: ``crossq`` → CrossQ, ``ppo`` → PPO."""
    return {"crossq": "CrossQ"}.get(algo, algo.upper())


class ZooError(ValueError):
    """One line: what of the Zoo's entry cannot be mapped, and why."""


@dataclass(frozen=True)
class Options:
    """How the command maps an entry beyond its numbers (its flags).

    Attributes:
        exact_updates: keep DQN's ``gradient_steps`` and ``batch_size`` as they are (``--exact-updates``).
        copies: environment copies an off-policy round is divided among (``--copies``); None: the Zoo's ``n_envs``.
    """

    exact_updates: bool = False
    copies: int | None = None

    def flags(self) -> str:
        """The command-line flags that give these options (for the config's header)."""
        return " --exact-updates" * self.exact_updates + ("" if self.copies is None else f" --copies {self.copies}")

    def refuse_copies(self, algo: str) -> None:
        """On-policy entries: their rollout is the Zoo's ``n_envs`` copies, not a round to divide."""
        if self.copies is not None:
            raise ZooError(
                f"--copies {self.copies}: divides an off-policy round; {display_name(algo)}'s rollout is n_steps "
                "from each of the Zoo's n_envs copies"
            )


@dataclass
class Node:
    """A config entry: a value (a dict of scalars is written inline, ``{a: 1, b: 2}``) with the comment beside it,
    or children (a mapping, or a list of mappings and values)."""

    value: Any = None
    comment: str = ""
    children: dict[str, Node] | list[dict[str, Node] | Node] | None = None


@dataclass
class Entry:
    """The Zoo's entry for one environment with Stable-Baselines3's defaults under it, and what of it cannot be
    mapped (collected, so that the one error line names every such key)."""

    algo: str
    env_id: str
    values: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    #: keys beyond Stable-Baselines3's defaults that the mapping has read (an Atari entry's wrapper and frame stack)
    read: set[str] = field(default_factory=set)
    #: an Atari entry: stacked frames of AtariWrapper on an Atari game, read by CnnPolicy (:func:`atari_environment`)
    images: bool = False

    def __getitem__(self, key: str) -> Any:
        return self.values[key] if key in self.values else SB3_DEFAULTS[self.algo][key]

    def name(self, key: str) -> str:
        """``key`` as the comment shows it: the Zoo's key, or SB3's default when the entry has none."""
        return key if key in self.values else f"{key} (Stable-Baselines3's default)"

    def refuse_unknown(self, *known: str) -> None:
        """Every key of the entry that is neither a default's nor among ``known``: a problem each."""
        for key in sorted(set(self.values) - set(SB3_DEFAULTS[self.algo]) - _READ - self.read - set(known)):
            self.problems.append(f"{key}: not mapped (no lightrl option for it in this command yet)")

    def check(self) -> None:
        """Raise the one line naming every problem found (a policy other than an MLP, or a CNN on Atari frames,
        among them)."""
        policy = self.values.get("policy", "MlpPolicy")
        if policy != ("CnnPolicy" if self.images else "MlpPolicy"):
            self.problems.append(
                f"policy {policy}: only MlpPolicy entries, and CnnPolicy on an Atari game's frames "
                "(env_wrapper AtariWrapper), are mapped"
            )
        if self.problems:
            raise ZooError(f"cannot map {self.algo} {self.env_id}: " + "; ".join(self.problems))


def hyperparams_folder() -> Path:
    """The installed ``rl_zoo3``'s ``hyperparams`` folder, found without importing the package (its ``__init__``
    imports Stable-Baselines3 and gym)."""
    spec = importlib.util.find_spec("rl_zoo3")
    if spec is None or not spec.submodule_search_locations:
        raise ZooError('the RL Zoo is not installed: pip install -e ".[zoo]" (rl-zoo3)')
    return Path(next(iter(spec.submodule_search_locations))) / "hyperparams"


def zoo_table(algo: str) -> dict[str, Any]:
    """``hyperparams/<algo>.yml`` of the installed ``rl_zoo3``: its entries by environment id."""
    import yaml

    table = hyperparams_folder() / f"{algo}.yml"
    if not table.is_file():
        raise ZooError(f"--algo {algo}: the RL Zoo has no hyperparams/{algo}.yml")
    return yaml.safe_load(table.read_text())


def entry_id(table: dict[str, Any], algo: str, env_id: str) -> str:
    """Which entry of ``algo``'s ``table`` is ``env_id``'s: its own; for an Atari game the table does not list, its
    ``atari`` entry (as the Zoo chooses: :func:`atari_game`); for a registered id whose task the table lists in
    another version only, the newest version it lists (``HalfCheetah-v5``: the Zoo's ``HalfCheetah-v4``, as tuned
    before Gymnasium's v5). Anything else is one error line."""
    import gymnasium
    from gymnasium.envs.registration import parse_env_id

    if env_id == "atari":
        raise ZooError(f"--env atari: the Zoo's entry for every Atari game; name a game, e.g. {ATARI_EXAMPLE}")
    if env_id in table:
        return env_id
    if "atari" in table and atari_game(env_id) is not None:
        return "atari"
    namespace, name, _ = parse_env_id(env_id)
    versions = {}
    for listed in table:
        with contextlib.suppress(gymnasium.error.Error):  # "atari", "default": no environment ids
            listed_namespace, listed_name, version = parse_env_id(listed)
            if (listed_namespace, listed_name) == (namespace, name) and version is not None:
                versions[version] = listed
    if versions and env_id in gymnasium.registry:
        return versions[max(versions)]
    atari = ""
    if "atari" in table and importlib.util.find_spec("ale_py") is None:
        atari = '; an Atari game needs ale-py: pip install -e ".[gym]"'
    raise ZooError(f"--env {env_id}: not in the RL Zoo's hyperparams/{algo}.yml ({len(table)} entries){atari}")


def zoo_entry(algo: str, env_id: str) -> dict[str, Any]:
    """The Zoo's hyperparameters for ``env_id`` in ``hyperparams/<algo>.yml`` (:func:`entry_id` says which entry)."""
    table = zoo_table(algo)
    return dict(table[entry_id(table, algo, env_id)])


def atari_game(env_id: str) -> Any:
    """``env_id``'s registered spec when it is an Atari game, whose entry point is ALE's ``AtariEnv`` (the Zoo's test
    for its ``atari`` entry: ``BreakoutNoFrameskip-v4``, ``ALE/Breakout-v5``, ...); None for any other id, and where
    ale-py is not installed."""
    import gymnasium

    with contextlib.suppress(ImportError):
        import ale_py

        gymnasium.register_envs(ale_py)
    spec = gymnasium.envs.registry.get(env_id)
    return spec if spec is not None and "AtariEnv" in str(spec.entry_point) else None


def atari_environment(zoo: Entry) -> dict[str, Node]:
    """``env.init_args`` of an Atari entry beyond its ``env_id`` (``env_wrapper`` Stable-Baselines3's AtariWrapper on
    an Atari game, ``frame_stack``), which marks the entry as one of images (:attr:`Entry.images`). AtariWrapper's
    steps become Gymnasium's wrappers in its order: ``AtariPreprocessing`` (up to 30 no-op starts, each action
    repeated on 4 frames with the last two max-pooled, 84×84 grey bytes), ``envs.gym.atari.FireReset`` (FIRE at a
    game's start and after a lost life, in games that need it), ``FrameStackObservation`` (``frame_stack``) and
    ``ClipReward`` (±1, the reward's sign); its ``terminal_on_life_loss`` is ``episodic_life``. The emulator is the
    one AtariWrapper is written for, every frame and no sticky actions (the ``NoFrameskip-v4`` ids'): an id
    registered otherwise (``ALE/Breakout-v5``: 4 frames a step, sticky actions 0.25) is given these in ``env_kwargs``.
    An entry without AtariWrapper: nothing (its ``env_wrapper`` and ``frame_stack`` are refused, by name)."""
    wrappers = zoo.values.get("env_wrapper")
    if (wrappers if isinstance(wrappers, list) else [wrappers]) != [ATARI_WRAPPER]:
        return {}  # none, or another wrapper (or AtariWrapper with arguments): refused by refuse_unknown
    zoo.read |= {"env_wrapper", "frame_stack"}
    spec = atari_game(zoo.env_id)
    if spec is None:
        zoo.problems.append(f"env_wrapper AtariWrapper: {zoo.env_id} is not an Atari game (ale-py's AtariEnv)")
        return {}
    stack = zoo.values.get("frame_stack")
    if not isinstance(stack, int) or stack < 1:
        zoo.problems.append(f"frame_stack {stack}: AtariWrapper's frames are mapped stacked (frame_stack N)")
        return {}
    zoo.images = True
    nodes = {"env_id": Node(zoo.env_id, "an Atari game (ale-py: the gym extra)")}
    if spec.kwargs.get("frameskip") != 1 or spec.kwargs.get("repeat_action_probability") != 0:
        game = zoo.env_id.split("/")[-1].split("-")[0].removesuffix("NoFrameskip").removesuffix("Deterministic")
        emulator = {
            "frameskip": Node(1, "every frame (AtariPreprocessing skips 4 and max-pools the last two)"),
            "repeat_action_probability": Node(0.0, "no sticky actions"),
        }
        nodes["env_kwargs"] = Node(children=emulator, comment=f"{game}NoFrameskip-v4's emulator, as the Zoo plays it:")
    screen = {"noop_max": 30, "frame_skip": 4, "screen_size": ATARI_SCREEN, "grayscale_obs": True, "scale_obs": False}
    steps = [
        {
            "class_path": Node(
                "AtariPreprocessing", "noop reset (up to 30), frame skip 4, 84x84 grey, uint8 (not scaled)"
            ),
            "init_args": Node(screen),
        },
        Node("envs.gym.atari.FireReset", "FIRE at game start and after a lost life (FireResetEnv)"),
        {
            "class_path": Node("FrameStackObservation", f"frame_stack {stack}: observations {frames_shape(zoo)}"),
            "init_args": Node({"stack_size": stack}),
        },
        {
            "class_path": Node("ClipReward", "AtariWrapper's reward clipping (its sign: Atari rewards are integers)"),
            "init_args": Node({"min_reward": -1.0, "max_reward": 1.0}),
        },
    ]
    nodes["wrappers"] = Node(children=steps, comment="AtariWrapper's steps, in its order, as Gymnasium wrappers:")
    nodes["episodic_life"] = Node(True, "AtariWrapper's terminal_on_life_loss: a lost life ends the agent's episode")
    return nodes


def frames_shape(zoo: Entry) -> str:
    """An Atari entry's observation as a comment writes it: ``[4, 84, 84]``."""
    return f"[{zoo.values['frame_stack']}, {ATARI_SCREEN}, {ATARI_SCREEN}]"


def zoo_version() -> str:
    """The installed RL Zoo's version."""
    from importlib.metadata import version

    return version("rl_zoo3")


def policy_kwargs(text: str) -> dict[str, Any]:
    """The Zoo's ``policy_kwargs`` string, ``dict(net_arch=[256, 256], activation_fn=nn.Tanh)``, as a dict of
    literals (activation functions by name): read, never evaluated."""
    tree = ast.parse(text, mode="eval").body
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "dict"):
        raise ZooError(f"policy_kwargs {text!r}: not a dict(...) of literals")
    kwargs = {}
    for keyword in tree.keywords:
        value = keyword.value
        if isinstance(value, ast.Attribute):  # nn.Tanh
            kwargs[keyword.arg] = value.attr
        elif isinstance(value, ast.Name):  # optimizer_class=RMSpropTFLike: a class by its name
            kwargs[keyword.arg] = value.id
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
            kwargs[keyword.arg] = {k.arg: ast.literal_eval(k.value) for k in value.keywords}  # net_arch=dict(pi=..)
        else:
            kwargs[keyword.arg] = ast.literal_eval(value)
    return kwargs


def number(value: float) -> int | float:
    """``value`` as an int when it is whole (the Zoo writes ``5e4``)."""
    return int(value) if float(value).is_integer() else float(value)


def network(zoo: Entry, taken: dict[str, Any] | None = None) -> dict[str, Node]:
    """``model.network`` from ``policy_kwargs`` over Stable-Baselines3's policy defaults; the keys of ``taken`` are
    the caller's (their values are put there)."""
    kwargs = policy_kwargs(SB3_DEFAULTS[zoo.algo]["policy_kwargs"])
    given = policy_kwargs(zoo.values["policy_kwargs"]) if "policy_kwargs" in zoo.values else {}
    kwargs.update(given)
    for key in taken or {}:
        if key in kwargs:
            taken[key] = kwargs.pop(key)
    default = {key: "" if key in given else " (Stable-Baselines3's default)" for key in kwargs}
    hidden = kwargs.pop("net_arch")
    nodes = {}
    if isinstance(hidden, dict) and set(hidden) == {"pi", "qf"}:  # an actor-critic's actor and Q critics (SAC's)
        note = f"policy_kwargs net_arch qf{default['net_arch']}"
        nodes["critic_hidden_sizes"] = Node(list(hidden["qf"]), f"{note}, the same for each critic")
        hidden, arch = hidden["pi"], f"pi {list(hidden['pi'])}"
    elif isinstance(hidden, dict):  # a policy's and its value's layers: lightrl's PPO has the same sizes
        if set(hidden) != {"pi", "vf"} or hidden["pi"] != hidden["vf"]:
            zoo.problems.append(f"policy_kwargs net_arch {hidden}: lightrl's actor and critic have the same sizes")
        hidden = hidden.get("pi", [64, 64])
        arch = str(list(hidden))
    else:
        arch = str(list(hidden))
    nodes = {"hidden_sizes": Node(list(hidden), f"policy_kwargs net_arch {arch}{default['net_arch']}"), **nodes}
    activation = _ACTIVATIONS.get(kwargs.pop("activation_fn"))
    if activation is None:
        zoo.problems.append("policy_kwargs activation_fn: lightrl's networks use ReLU or Tanh")
    elif activation != "relu":
        nodes["activation"] = Node(activation, f"policy_kwargs activation_fn{default['activation_fn']}")
    if "ortho_init" in kwargs:
        nodes["orthogonal_init"] = Node(
            bool(kwargs.pop("ortho_init")), f"policy_kwargs ortho_init{default['ortho_init']}"
        )
    name = display_name(zoo.algo)
    zoo.problems += [f"policy_kwargs {key}: not an option of lightrl's {name} network" for key in kwargs]
    return nodes


def cnn_network(zoo: Entry, taken: dict[str, Any] | None = None) -> dict[str, Node]:
    """``model.network`` of a CnnPolicy entry: Stable-Baselines3's CnnPolicy is the Nature CNN (Mnih et al. 2015: three
    convolutions and a 512-wide layer) with a linear layer on its features for each output (its ``net_arch`` after
    the CNN is empty), which ``network: {kind: auto}`` builds for uint8 frames; PPO's and A2C's actor and critic share
    it, as CnnPolicy's. ``policy_kwargs`` ``ortho_init`` is ``orthogonal_init``; the keys of ``taken`` are the
    caller's (their values are put there); any other is a problem."""
    given = policy_kwargs(zoo.values["policy_kwargs"]) if "policy_kwargs" in zoo.values else {}
    for key in taken or {}:
        if key in given:
            taken[key] = given.pop(key)
    heads = {
        "dqn": "the Nature CNN and its linear Q-head",
        "qrdqn": "the Nature CNN, a linear head of actions x quantiles",
    }.get(zoo.algo, "one Nature CNN for actor and critic, a linear head each")
    nodes = {"kind": Node("auto", f"CnnPolicy: {heads} ({frames_shape(zoo)} bytes)")}
    if zoo.algo in ("ppo", "a2c"):  # ActorCriticCnnPolicy's orthogonal initialisation; DQN's family has none
        default = "" if "ortho_init" in given else " (Stable-Baselines3's default)"
        nodes["orthogonal_init"] = Node(bool(given.pop("ortho_init", True)), f"policy_kwargs ortho_init{default}")
    zoo.problems += [f"policy_kwargs {key}: not an option of lightrl's Nature CNN (CnnPolicy)" for key in given]
    return nodes


def rate(zoo: Entry, key: str, budget: int) -> tuple[float, dict[str, Node]]:
    """A number or a ``lin_X`` schedule of the Zoo's ``key``: its value at the start, and (for lin_X) the
    ``lr_end``/``lr_decay``/``lr_frames`` nodes of a linear decay to 0 over the budget."""
    value = zoo[key]
    if not isinstance(value, str):
        return float(value), {}
    if not value.startswith("lin_"):
        zoo.problems.append(f"{key} {value}: only lin_X schedules are mapped")
        return 0.0, {}
    return float(value[4:]), {
        "lr_end": Node(0.0, f"{key} {value}: linear to 0 ..."),
        "lr_decay": Node("linear", "... as Stable-Baselines3's linear schedule ..."),
        "lr_frames": Node(budget, "... over n_timesteps"),
    }


def trainer(max_steps: int, steps_note: str, run_name: str, budget: int) -> Node:
    """``trainer``: the budget in updates, a CSV logger in ``runs/<run_name>``, checkpoints every fifth of the budget
    and greedy evaluations every tenth."""
    evaluation = {"every_n_frames": Node(budget // 10, "a tenth of the budget")}
    evaluation["episodes"] = Node(16, "greedy episodes, one per evaluation copy")
    logger = {"save_dir": Node("runs", f"runs/{run_name}/version_N/"), "name": Node(run_name)}
    return Node(
        children={
            "max_steps": Node(max_steps, steps_note),
            "log_every_n_steps": Node(100 if max_steps < 10_000 else 500),
            "logger": Node(
                children={
                    "class_path": Node("lightning.pytorch.loggers.CSVLogger"),
                    "init_args": Node(children=logger),
                }
            ),
            "callbacks": Node(
                children=[
                    {
                        "class_path": Node("callbacks.schedule.FrameCheckpoint"),
                        "init_args": Node(children={"every_n_frames": Node(budget // 5, "a fifth of the budget")}),
                    },
                    {
                        "class_path": Node("callbacks.schedule.PeriodicEvaluation"),
                        "init_args": Node(children=evaluation),
                    },
                    {"class_path": Node("callbacks.throughput.ThroughputReport")},
                ]
            ),
        }
    )


def config(
    threads_note: str,
    train: Node,
    model: str,
    model_args: dict,
    data: str,
    data_args: dict,
    atari: dict[str, Node] | None = None,
) -> dict:
    """The whole config: one thread, seed 0, ``train`` (:func:`trainer`), the model and the data module; with
    ``atari`` (:func:`atari_environment`'s nodes), the game's wrappers, evaluations of whole games and two threads."""
    env_id = data_args.pop("env_id")
    environment = {"env_id": Node(env_id, "a registered Gymnasium id (Box2D etc.: the gym extra)")}
    evaluation = {"episodes": Node(16, "default episodes for `validate`")}
    threads = Node(1, threads_note)
    if atari:
        environment |= atari
        whole_games = "evaluation plays whole games: episode_return_mean is the game's score"
        evaluation["env_options"] = Node(children={"episodic_life": Node(False, whole_games)})
        threads = Node(2, "Nature-CNN updates: both cores of a 2-core CPU")
    data_args = {
        "env": Node(
            children={"class_path": Node("envs.gym.env.GymnasiumEnv"), "init_args": Node(children=environment)}
        ),
        **data_args,
        "seed": Node(0, "environment seed; copy i plays stream seed + i"),
        "evaluation": Node(children=evaluation),
    }
    return {
        "threads": threads,
        "seed_everything": Node(0, "seeds model init and exploration; environments are seeded by data.init_args.seed"),
        "trainer": train,
        "model": Node(children={"class_path": Node(model), "init_args": Node(children=model_args)}),
        "data": Node(children={"class_path": Node(data), "init_args": Node(children=data_args)}),
    }


def map_dqn(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a DQN entry (module docstring: the rules)."""
    return map_q_learning("dqn", entry, env_id, run_name, options)


def map_qrdqn(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a QR-DQN entry: DQN's rules, ``policy_kwargs`` ``n_quantiles`` as ``model.quantiles``."""
    return map_q_learning("qrdqn", entry, env_id, run_name, options)


def map_q_learning(algo: str, entry: dict[str, Any], env_id: str, run_name: str, options: Options) -> dict:
    """DQN's and QR-DQN's config (module docstring: the rules)."""
    zoo = Entry(algo, env_id, entry)
    atari = atari_environment(zoo)
    if zoo.images:  # how the replay keeps the frames: data.store_frames_once
        zoo.read.add("optimize_memory_usage")
    zoo.refuse_unknown()
    budget = number(zoo["n_timesteps"])
    round_frames, updates, copies, frames_per_update = replay_round(zoo, options.copies)
    n_envs, train_freq = zoo["n_envs"], round_frames // zoo["n_envs"]
    batch, batch_note = zoo["batch_size"], zoo.name("batch_size")
    if not options.exact_updates and updates > MERGED_UPDATES and batch <= MERGED_UPDATES and updates % 2 == 0:
        updates, batch = updates // 2, 2 * batch
        batch_note = f"batch_size {batch // 2} x gradient_steps {updates * 2}, taken as {batch} x {updates}"
        frames_per_update = number(round_frames / updates)
    warmup = number(zoo["learning_starts"])
    interval_frames = zoo["target_update_interval"]
    interval = updates if interval_frames < round_frames else max(1, round(interval_frames / frames_per_update))
    taken: dict[str, Any] = {"n_quantiles": None}
    net = (cnn_network if zoo.images else network)(zoo, taken if algo == "qrdqn" else None)
    learning_rate, schedule = rate(zoo, "learning_rate", budget)
    zoo.check()
    target = {"update": Node("hard", "Stable-Baselines3 copies the online network (tau 1)")}
    if zoo["tau"] < 1:
        target = {"update": Node("soft", "tau < 1: Polyak averaging"), "tau": Node(float(zoo["tau"]), zoo.name("tau"))}
    once_a_round = "shorter than a round, so once a round in effect"
    every = once_a_round if interval_frames < round_frames else f"{interval} updates of {frames_per_update} frames"
    target["interval"] = Node(interval, f"target_update_interval {interval_frames} frames: {every}")
    max_steps, steps_note = replay_budget(budget, warmup, frames_per_update)
    exploration = {
        "eps_start": Node(float(zoo["exploration_initial_eps"]), zoo.name("exploration_initial_eps")),
        "eps_end": Node(float(zoo["exploration_final_eps"]), zoo.name("exploration_final_eps")),
        "eps_frames": Node(
            number(round(zoo["exploration_fraction"] * budget)),
            f"exploration_fraction {zoo['exploration_fraction']} of n_timesteps",
        ),
    }
    optimizer = {"lr": Node(learning_rate, zoo.name("learning_rate")), **schedule}
    if zoo["max_grad_norm"] is not None:  # QR-DQN's default: no clipping
        optimizer["max_grad_norm"] = Node(float(zoo["max_grad_norm"]), zoo.name("max_grad_norm"))
    model = {"network": Node(children=net)}
    if algo == "qrdqn":
        quantiles = taken["n_quantiles"]
        model["quantiles"] = (
            Node(200, "policy_kwargs n_quantiles (Stable-Baselines3 contrib's default)")
            if quantiles is None
            else Node(quantiles, "policy_kwargs n_quantiles")
        )
    model |= {
        "gamma": Node(float(zoo["gamma"]), zoo.name("gamma")),
        **({"loss_function": Node("smooth_l1", "Stable-Baselines3's DQN loss (Huber)")} if algo == "dqn" else {}),
        "target": Node(children=target),
        "exploration": Node(children=exploration),
        "optimizer": Node(children=optimizer),
    }
    model |= {} if zoo.images else compiled(max_steps)
    data = {
        "env_id": env_id,
        "num_envs": Node(copies, f"copies stepped together (the Zoo: n_envs {n_envs})"),
        "collect_steps": Node(round_frames // copies, f"a round of train_freq {train_freq} x n_envs {n_envs} frames"),
        "buffer_size": Node(number(zoo["buffer_size"]), zoo.name("buffer_size")),
        **(frames_once(zoo) if zoo.images else {}),
        "batch_size": Node(batch, batch_note),
        "warmup_frames": Node(warmup, zoo.name("learning_starts")),
        "frames_per_update": Node(frames_per_update, f"the round's frames over its {updates} updates"),
    }
    small = "small MLP updates: one thread is fastest on a shared CPU"
    train = trainer(max_steps, steps_note, run_name, budget)
    agent = "modules.dqn.DQN" if algo == "dqn" else "modules.qrdqn.QRDQN"
    return config(small, train, agent, model, "datamodules.replay.ReplayDataModule", data, atari)


def frames_once(zoo: Entry) -> dict[str, Node]:
    """``data.store_frames_once`` of an Atari replay: each frame kept once, the transitions holding their frames' ids
    (:class:`~datamodules.frames.FrameStackStore`), where Stable-Baselines3 keeps two whole stacks a transition
    (``optimize_memory_usage`` false) or each observation once (true). The same transitions are drawn either way:
    only the memory differs, which the comment gives (the frame ring's default capacity, a quarter more frames than
    transitions, at least 4,096 more)."""
    buffer, frame = zoo["buffer_size"], ATARI_SCREEN * ATARI_SCREEN
    whole = buffer * 2 * zoo.values["frame_stack"] * frame
    once = (buffer + max(buffer // 4, 4096)) * frame
    usage = zoo.values.get("optimize_memory_usage", False)
    sizes = f"{once / 1e9:.1f} GB, not {whole / 1e9:.1f} GB"
    return {
        "store_frames_once": Node(True, f"optimize_memory_usage {usage}: the same samples, each frame once: {sizes}")
    }


def replay_budget(budget: int, warmup: int, frames_per_update: int | float) -> tuple[int, str]:
    """An off-policy run's ``max_steps`` (the frames after the warm-up, in updates) and its comment."""
    steps = number(math.ceil((budget - warmup) / frames_per_update))
    return steps, f"n_timesteps {budget} frames, less {warmup} of warm-up, {frames_per_update} an update"


def replay_round(zoo: Entry, copies: int | None = None) -> tuple[int, int, int, int | float]:
    """An off-policy entry's round: its frames (``train_freq × n_envs``), its updates (``gradient_steps``; ``-1``: one
    per environment step), the copies that step it together (``copies``, which must divide the round; None: the
    Zoo's ``n_envs``), and the frames per update."""
    train_freq = zoo["train_freq"]
    if not isinstance(train_freq, int):
        zoo.problems.append(f"train_freq {train_freq}: rounds counted in episodes are not mapped (lightrl's: frames)")
        train_freq = 1
    n_envs = zoo["n_envs"]
    frames = train_freq * n_envs
    updates = zoo["gradient_steps"] if zoo["gradient_steps"] > 0 else train_freq
    if copies is None:
        copies = n_envs
    elif copies < 1 or frames % copies:
        raise ZooError(
            f"--copies {copies}: must be a positive divisor of the round's {frames} frames "
            f"(train_freq {train_freq} x n_envs {n_envs})"
        )
    return frames, updates, copies, number(frames / updates)


def map_sac(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a SAC entry: rounds, warm-up and budget as DQN's, the data as :func:`replay_data`;
    ``ent_coef: auto`` or ``auto_X`` is α learned from 1 or X, a number a fixed α; one soft update of the target
    critics per update (``target_update_interval`` 1); ``policy_kwargs`` ``n_critics`` the critics' count."""
    return map_soft_actor_critic("sac", entry, env_id, run_name, options)


def map_tqc(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a TQC entry: SAC's (:func:`map_sac`), with ``policy_kwargs`` ``n_quantiles`` each
    critic's quantiles and ``top_quantiles_to_drop_per_net`` the target's quantiles dropped per critic."""
    return map_soft_actor_critic("tqc", entry, env_id, run_name, options)


def map_crossq(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a CrossQ entry: SAC's (:func:`map_sac`) without target networks, with ``policy_delay``,
    ``policy_kwargs`` ``batch_norm_momentum`` and ``renorm_warmup_steps`` (the batch renormalisation), and
    Stable-Baselines3 contrib's Adam β₁ of 0.5."""
    return map_soft_actor_critic("crossq", entry, env_id, run_name, options)


#: Each soft actor-critic's own ``policy_kwargs`` beyond the networks' sizes and activation.
SOFT_ACTOR_CRITIC_KWARGS = {
    "sac": ("n_critics",),
    "tqc": ("n_critics", "n_quantiles"),
    "crossq": ("n_critics", "batch_norm_momentum", "renorm_warmup_steps"),
}


def map_soft_actor_critic(
    algo: str, entry: dict[str, Any], env_id: str, run_name: str, options: Options
) -> dict[str, Node]:
    """SAC's, TQC's and CrossQ's config on ``modules.sac.SAC``, ``modules.tqc.TQC`` and ``modules.crossq.CrossQ``
    (:func:`map_sac`, :func:`map_tqc`, :func:`map_crossq`)."""
    zoo = Entry(algo, env_id, entry)
    zoo.refuse_unknown()
    budget = number(zoo["n_timesteps"])
    taken: dict[str, Any] = dict.fromkeys(SOFT_ACTOR_CRITIC_KWARGS[algo])
    net = network(zoo, taken)
    learning_rate, schedule = rate(zoo, "learning_rate", budget)
    ent_coef = str(zoo["ent_coef"])
    learned = ent_coef == "auto" or ent_coef.startswith("auto_")  # else a number: a fixed α
    try:
        alpha = 1.0 if ent_coef == "auto" else float(ent_coef[5:] if learned else ent_coef)
    except ValueError:
        zoo.problems.append(f"ent_coef {ent_coef}: a number, auto or auto_X")
    if algo != "crossq" and zoo["target_update_interval"] != 1:
        every = f"lightrl's {display_name(algo)} updates its target critics every update"
        zoo.problems.append(f"target_update_interval: {every}")
    layers, critics = actor_critic_networks(zoo, net, taken["n_critics"])
    target_entropy = zoo["target_entropy"]
    actor = {"hidden_sizes": layers, "init_scale": Node(1.0, "the Gaussian's scale before tanh where its layer is 0")}
    model = {"actor": Node(children=actor), "critics": critics}
    if algo == "tqc":
        given = policy_kwargs(entry.get("policy_kwargs", "dict()"))
        default = "" if "n_quantiles" in given else " (Stable-Baselines3's default)"
        model["quantiles"] = Node(taken["n_quantiles"], f"policy_kwargs n_quantiles{default}")
        model["dropped_per_critic"] = Node(
            zoo["top_quantiles_to_drop_per_net"], zoo.name("top_quantiles_to_drop_per_net")
        )
    betas = {}
    if algo == "crossq":
        given = policy_kwargs(entry.get("policy_kwargs", "dict()"))
        model["policy_delay"] = Node(zoo["policy_delay"], zoo.name("policy_delay"))
        model["batch_renorm"] = Node(
            children={
                "momentum": Node(taken["batch_norm_momentum"], _kwarg_note("batch_norm_momentum", given)),
                "warmup_steps": Node(taken["renorm_warmup_steps"], _kwarg_note("renorm_warmup_steps", given)),
            }
        )
        betas = {"betas": Node([0.5, 0.999], "Stable-Baselines3 contrib's CrossQ: Adam's beta1 0.5")}
    model |= {
        "gamma": Node(float(zoo["gamma"]), zoo.name("gamma")),
        "alpha_init": Node(alpha, f"ent_coef {ent_coef}: α learned, starting at {alpha}" if learned else "ent_coef"),
        **({} if learned else {"learn_alpha": Node(False, f"ent_coef {ent_coef}: a fixed α")}),
        "target_entropy": Node(
            target_entropy if target_entropy == "auto" else float(target_entropy), zoo.name("target_entropy")
        ),
        "optimizer": Node(
            children={
                "lr": Node(learning_rate, zoo.name("learning_rate") + " (actor, critics and α)"),
                **schedule,
                **betas,
            }
        ),
    }
    model_class = {"sac": "modules.sac.SAC", "tqc": "modules.tqc.TQC", "crossq": "modules.crossq.CrossQ"}[algo]
    return actor_critic_config(zoo, env_id, run_name, budget, model_class, model, options.copies)


def _kwarg_note(key: str, given: dict[str, Any]) -> str:
    return f"policy_kwargs {key}" + ("" if key in given else " (Stable-Baselines3 contrib's default)")


def actor_critic_networks(zoo: Entry, net: dict[str, Node], count: int = 2) -> tuple[Node, Node]:
    """An actor-critic entry's (SAC, TQC, TD3) ReLU networks of ``net_arch``, checked with the entry's other problems
    (its round's among them): the actor's ``hidden_sizes`` node and the ``critics`` group (the same sizes, ``count``
    critics when not 2, ``tau``)."""
    replay_round(zoo)  # a round counted in episodes is a problem, named in the one line with the others
    if "activation" in net:  # network() writes it only when not ReLU
        zoo.problems.append(f"policy_kwargs activation_fn: lightrl's {display_name(zoo.algo)} networks are ReLU MLPs")
    zoo.check()
    layers = net.pop("hidden_sizes")
    each = "the same for each of the two critics" if count == 2 else f"the same for each of the {count} critics"
    critics = {"hidden_sizes": net.pop("critic_hidden_sizes", Node(layers.value, each))}
    if count != 2:
        critics["count"] = Node(count, "policy_kwargs n_critics")
    if zoo.algo != "crossq":  # no target networks
        critics["tau"] = Node(float(zoo["tau"]), zoo.name("tau"))
    return layers, Node(children=critics)


def actor_critic_config(
    zoo: Entry,
    env_id: str,
    run_name: str,
    budget: int,
    model_class: str,
    model: dict[str, Node],
    copies: int | None,
) -> dict[str, Node]:
    """The whole config of an actor-critic entry: ``model`` under ``model_class``, the budget in updates after the
    warm-up, and the data of :func:`replay_data` (``copies``: :attr:`Options.copies`)."""
    _, _, _, frames_per_update = replay_round(zoo, copies)
    max_steps, steps_note = replay_budget(budget, number(zoo["learning_starts"]), frames_per_update)
    small = "batch-256 updates of small MLPs: one thread is fastest on a shared CPU"
    train = trainer(max_steps, steps_note, run_name, budget)
    data = replay_data(zoo, env_id, budget, copies)
    return config(small, train, model_class, model, "datamodules.replay.ReplayDataModule", data)


def replay_data(zoo: Entry, env_id: str, budget: int, copies: int | None) -> dict[str, Any]:
    """``data`` of an actor-critic off-policy entry (SAC, TD3): the round of ``train_freq × n_envs`` frames and its
    ``gradient_steps``, the replay buffer at most the run's frames (a larger one never overwrites: the same draws, less
    memory), the batch and the warm-up."""
    round_frames, updates, copies, frames_per_update = replay_round(zoo, copies)
    buffer = min(number(zoo["buffer_size"]), budget)
    buffer_note = zoo.name("buffer_size") + (": at most the run's frames" if buffer < zoo["buffer_size"] else "")
    return {
        "env_id": env_id,
        "num_envs": Node(copies, f"copies stepped together (the Zoo: n_envs {zoo['n_envs']})"),
        "collect_steps": Node(round_frames // copies, f"a round of train_freq x n_envs: {round_frames} frames"),
        "buffer_size": Node(buffer, buffer_note),
        "batch_size": Node(zoo["batch_size"], zoo.name("batch_size")),
        "warmup_frames": Node(number(zoo["learning_starts"]), zoo.name("learning_starts")),
        "frames_per_update": Node(frames_per_update, f"the round's frames over its {updates} updates"),
    }


def map_td3(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a TD3 entry: rounds, warm-up, budget and buffer as SAC's; ``noise_type: normal`` with
    ``noise_std`` is the acting noise (in half-range units, as Stable-Baselines3's); the target policy's smoothing
    noise, its clip and the policy delay as Stable-Baselines3's (``target_policy_noise``, ``target_noise_clip``,
    ``policy_delay``); actor and critics of ``net_arch``. During the warm-up lightrl's TD3 acts uniformly at random,
    as Stable-Baselines3 does before ``learning_starts``."""
    return map_deterministic("td3", entry, env_id, run_name, options)


def map_ddpg(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a DDPG entry: TD3's (:func:`map_td3`) with what Stable-Baselines3's DDPG sets, which is
    TD3 without its three tricks: one critic (``n_critics`` 1), no target policy smoothing, the actor and the targets
    updated every update."""
    return map_deterministic("ddpg", entry, env_id, run_name, options)


def map_deterministic(
    algo: str, entry: dict[str, Any], env_id: str, run_name: str, options: Options
) -> dict[str, Node]:
    """TD3's and DDPG's config on ``modules.td3.TD3`` (:func:`map_td3`, :func:`map_ddpg`)."""
    zoo = Entry(algo, env_id, entry)
    zoo.refuse_unknown("noise_type", "noise_std")
    budget = number(zoo["n_timesteps"])
    net = network(zoo)
    learning_rate, schedule = rate(zoo, "learning_rate", budget)
    noise_type, noise_std = zoo.values.get("noise_type"), float(zoo.values.get("noise_std", 0.0))
    if noise_type not in (None, "normal"):
        zoo.problems.append(f"noise_type {noise_type}: lightrl's TD3 acts with Gaussian noise (normal)")
    layers, critics = actor_critic_networks(zoo, net)
    noise_note = f"noise_type normal, noise_std {noise_std}" if noise_type else "no action noise (the Zoo gives none)"
    if algo == "ddpg":  # Stable-Baselines3's DDPG class: its TD3 with these
        critics.children["hidden_sizes"].comment = "the critic's, the same sizes"
        critics.children["count"] = Node(1, "DDPG: one critic (Stable-Baselines3's n_critics 1)")
        tricks = {
            "target_noise": Node(0.0, "DDPG: no target policy smoothing"),
            "target_noise_clip": Node(0.0, "..."),
            "policy_delay": Node(1, "DDPG: the actor and the targets move every update"),
        }
    else:
        tricks = {
            "target_noise": Node(float(zoo["target_policy_noise"]), zoo.name("target_policy_noise")),
            "target_noise_clip": Node(float(zoo["target_noise_clip"]), zoo.name("target_noise_clip")),
            "policy_delay": Node(zoo["policy_delay"], zoo.name("policy_delay")),
        }
    model = {
        "actor": Node(children={"hidden_sizes": layers}),
        "critics": critics,
        "gamma": Node(float(zoo["gamma"]), zoo.name("gamma")),
        "action_noise": Node(noise_std, noise_note + " (half-range units)"),
        **tricks,
        "optimizer": Node(
            children={"lr": Node(learning_rate, zoo.name("learning_rate") + " (actor and critics)"), **schedule}
        ),
    }
    return actor_critic_config(zoo, env_id, run_name, budget, "modules.td3.TD3", model, options.copies)


def map_ppo(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of a PPO entry: a rollout of ``n_steps`` from each of ``n_envs`` copies, ``n_epochs``
    passes of minibatches of ``batch_size``; the budget is the whole rollouts that fit in ``n_timesteps``.
    ``options.exact_updates`` changes nothing here (DQN's rule only); ``options.copies`` is refused."""
    options.refuse_copies("ppo")
    zoo = Entry("ppo", env_id, entry)
    atari = atari_environment(zoo)
    zoo.refuse_unknown("normalize")
    budget = number(zoo["n_timesteps"])
    n_envs, n_steps, batch, epochs = zoo["n_envs"], zoo["n_steps"], zoo["batch_size"], zoo["n_epochs"]
    rollout = n_envs * n_steps
    if rollout % batch:
        zoo.problems.append(f"batch_size {batch}: lightrl's minibatches divide the rollout ({rollout} frames)")
    rollouts = int(budget // rollout)
    updates = epochs * max(rollout // batch, 1)
    taken: dict[str, Any] = {"log_std_init": None}
    net = (cnn_network if zoo.images else network)(zoo, taken)
    learning_rate, schedule = rate(zoo, "learning_rate", budget)
    clip, clip_schedule = rate(zoo, "clip_range", budget)
    normalize = normalization(zoo)
    zoo.check()
    loss = {"clip_epsilon": Node(clip, zoo.name("clip_range"))}
    if clip_schedule:
        loss["clip_epsilon"].comment = f"clip_range {zoo['clip_range']}: falling linearly to 0 ..."
        loss["clip_decay_frames"] = Node(budget, "... over n_timesteps")
    loss.update(actor_critic_terms(zoo))
    max_steps = rollouts * updates
    steps_note = f"n_timesteps {budget} frames: {rollouts} rollouts of {rollout} frames, {updates} updates each"
    optimizer = {
        "lr": Node(learning_rate, zoo.name("learning_rate")),
        **schedule,
        "max_grad_norm": Node(float(zoo["max_grad_norm"]), zoo.name("max_grad_norm")),
        "eps": Node(1e-5, "Stable-Baselines3's PPO Adam epsilon"),
    }
    model = on_policy_model(zoo, net, taken, normalize, loss, max_steps, optimizer)
    data = {
        "env_id": env_id,
        "num_envs": Node(n_envs, zoo.name("n_envs")),
        "collect_steps": Node(n_steps, f"{zoo.name('n_steps')}: {rollout} frames per rollout"),
        "minibatch_size": Node(batch, f"{zoo.name('batch_size')}: {rollout // batch} minibatches per epoch"),
        "update_epochs": Node(epochs, zoo.name("n_epochs")),
    }
    small = "small MLPs: one thread is fastest on a shared CPU"
    train = trainer(max_steps, steps_note, run_name, budget)
    return config(small, train, "modules.ppo.PPO", model, "datamodules.rollout.RolloutDataModule", data, atari)


def map_a2c(entry: dict[str, Any], env_id: str, run_name: str, options: Options = Options()) -> dict[str, Node]:
    """The lightrl config of an A2C entry: a rollout of ``n_steps`` from each of ``n_envs`` copies, one update on
    all of it (one minibatch, one epoch), RMSprop (``use_rms_prop``, ``rms_prop_eps``; ``policy_kwargs``
    ``optimizer_class`` RMSpropTFLike: TensorFlow's, :func:`a2c_optimizer`); the budget is the whole rollouts that fit
    in ``n_timesteps``. ``options.exact_updates`` changes nothing here (DQN's rule only); ``options.copies`` is
    refused."""
    options.refuse_copies("a2c")
    zoo = Entry("a2c", env_id, entry)
    atari = atari_environment(zoo)
    zoo.refuse_unknown("normalize")
    budget = number(zoo["n_timesteps"])
    n_envs, n_steps = zoo["n_envs"], zoo["n_steps"]
    rollout = n_envs * n_steps
    rollouts = int(budget // rollout)
    taken: dict[str, Any] = {"log_std_init": None, "optimizer_class": None, "optimizer_kwargs": None}
    net = (cnn_network if zoo.images else network)(zoo, taken)
    learning_rate, schedule = rate(zoo, "learning_rate", budget)
    normalize = normalization(zoo)
    algorithm, epsilon = a2c_optimizer(zoo, taken["optimizer_class"], taken["optimizer_kwargs"] or {})
    zoo.check()
    steps_note = f"n_timesteps {budget} frames: {rollouts} rollouts of {rollout} frames, one update each"
    optimizer = {
        "algorithm": algorithm,
        "lr": Node(learning_rate, zoo.name("learning_rate")),
        **schedule,
        "max_grad_norm": Node(float(zoo["max_grad_norm"]), zoo.name("max_grad_norm")),
        **epsilon,
    }
    model = on_policy_model(zoo, net, taken, normalize, actor_critic_terms(zoo), rollouts, optimizer)
    data = {
        "env_id": env_id,
        "num_envs": Node(n_envs, zoo.name("n_envs")),
        "collect_steps": Node(n_steps, f"{zoo.name('n_steps')}: {rollout} frames per rollout"),
        "minibatch_size": Node(rollout, "A2C: one update on the whole rollout"),
        "update_epochs": Node(1, "... once"),
    }
    small = "small MLPs: one thread is fastest on a shared CPU"
    train = trainer(rollouts, steps_note, run_name, budget)
    return config(small, train, "modules.a2c.A2C", model, "datamodules.rollout.RolloutDataModule", data, atari)


def a2c_optimizer(zoo: Entry, optimizer_class: str | None, kwargs: dict[str, Any]) -> tuple[Node, dict[str, Node]]:
    """A2C's ``model.optimizer.algorithm`` node and its ε (and α) nodes: Stable-Baselines3's A2C steps with PyTorch's
    RMSprop (``use_rms_prop``, its ε ``rms_prop_eps``) or Adam (ε 1e-5), unless ``policy_kwargs`` names an
    ``optimizer_class``, whose ``optimizer_kwargs`` alone it then takes (``use_rms_prop`` and ``rms_prop_eps`` unread):
    ``RMSpropTFLike`` (the Zoo's Atari entry) is ``rmsprop_tf``, TensorFlow's RMSprop, of its defaults but these."""
    if optimizer_class is None:
        if zoo["use_rms_prop"]:
            return Node("rmsprop", zoo.name("use_rms_prop")), {
                "eps": Node(float(zoo["rms_prop_eps"]), zoo.name("rms_prop_eps"))
            }
        return Node("adam", zoo.name("use_rms_prop")), {"eps": Node(1e-5, "Stable-Baselines3's A2C Adam epsilon")}
    algorithm = OPTIMIZER_CLASSES.get(optimizer_class)
    if algorithm is None:
        zoo.problems.append(
            f"policy_kwargs optimizer_class {optimizer_class}: lightrl maps {', '.join(OPTIMIZER_CLASSES)}"
        )
    unknown = sorted(set(kwargs) - {"eps", "alpha"})
    if unknown:
        zoo.problems.append(f"policy_kwargs optimizer_kwargs {unknown}: only eps and alpha are mapped")
    note = f"policy_kwargs optimizer_class {optimizer_class}: TensorFlow's RMSprop"
    given = {
        key: Node(float(kwargs[key]), f"policy_kwargs optimizer_kwargs {key}")
        for key in ("eps", "alpha")
        if key in kwargs
    }
    return Node(algorithm, note), {"eps": Node(1e-8, f"{optimizer_class}'s default"), **given}


def actor_critic_terms(zoo: Entry) -> dict[str, Node]:
    """PPO's and A2C's ``model.loss`` weights: the entropy bonus, the squared-error value loss, the advantages."""
    return {
        "entropy_coef": Node(float(zoo["ent_coef"]), zoo.name("ent_coef")),
        "critic_coef": Node(float(zoo["vf_coef"]), zoo.name("vf_coef")),
        "critic_loss": Node("l2", "Stable-Baselines3's squared-error value loss"),
        "normalize_advantage": Node(bool(zoo["normalize_advantage"]), zoo.name("normalize_advantage")),
    }


def on_policy_model(
    zoo: Entry,
    net: dict[str, Node],
    taken: dict[str, Any],
    normalize: dict[str, Node],
    loss: dict[str, Node],
    updates: int,
    optimizer: dict[str, Node],
) -> dict[str, Node]:
    """PPO's and A2C's ``model.init_args``: the network, the Gaussian's initial scale (``log_std_init``), the
    normalisation, γ and λ, the loss, compilation for long runs and the optimizer."""
    model = {"network": Node(children=net)}
    if taken["log_std_init"] is not None:  # the Gaussian's initial standard deviation, exp(log_std_init)
        scale = Node(round(math.exp(taken["log_std_init"]), 4), f"policy_kwargs log_std_init {taken['log_std_init']}")
        model["gaussian"] = Node(children={"init_scale": scale})
    if normalize:
        model["normalize"] = Node(children=normalize)
    return model | {
        "gamma": Node(float(zoo["gamma"]), zoo.name("gamma")),
        "gae_lambda": Node(float(zoo["gae_lambda"]), zoo.name("gae_lambda")),
        "loss": Node(children=loss),
        # The Nature CNN's update is its convolutions: compiled, it took a few per cent less (docs/guide/zoo.md).
        **({} if zoo.images else compiled(updates)),
        "optimizer": Node(children=optimizer),
    }


def normalization(zoo: Entry) -> dict[str, Node]:
    """``model.normalize`` from the Zoo's ``normalize`` (VecNormalize: ``true`` for observations and rewards, or a
    dict of ``norm_obs`` and ``norm_reward``); its clips are VecNormalize's 10, lightrl's defaults too."""
    value = zoo.values.get("normalize", False)
    if isinstance(value, str):
        text = value.strip()
        try:
            value = policy_kwargs(text) if text.startswith("dict(") else ast.literal_eval(text)
        except (ValueError, SyntaxError):
            zoo.problems.append(f"normalize {value!r}: not a dict of norm_obs and norm_reward")
            return {}
    if isinstance(value, bool):
        value = {"norm_obs": value, "norm_reward": value}
    unknown = set(value) - {"norm_obs", "norm_reward"}
    if unknown:
        zoo.problems.append(f"normalize {sorted(unknown)}: only norm_obs and norm_reward are mapped")
    nodes = {}
    if value.get("norm_obs", True):
        nodes["observations"] = Node(True, "normalize: norm_obs (running mean and variance, clipped at 10)")
    if value.get("norm_reward", True):
        nodes["rewards"] = Node(True, "normalize: norm_reward (by the discounted return's deviation)")
    return nodes if any(value.values()) else {}


def compiled(updates: int) -> dict[str, Node]:
    """``compile: true`` for runs of many updates (a compilation's seconds are then a small share), else nothing."""
    if updates <= COMPILE_ABOVE_UPDATES:
        return {}
    return {"compile": Node(True, f"{updates:,} updates: compiled, each costs less (docs/guide/zoo.md)")}


#: The algorithms this command maps: the function that maps an entry.
MAPPED = {
    "dqn": map_dqn,
    "qrdqn": map_qrdqn,
    "ppo": map_ppo,
    "a2c": map_a2c,
    "sac": map_sac,
    "tqc": map_tqc,
    "crossq": map_crossq,
    "td3": map_td3,
    "ddpg": map_ddpg,
}

#: The Zoo's algorithms this command does not map, each with what lightrl lacks for it.
NOT_MAPPED = {
    "ppo_lstm": "lightrl's recurrent PPO reads MettaGrid's token grids; an LSTM over other observations is not built",
    "trpo": "no TRPO agent in lightrl (TorchRL has no TRPO loss)",
    "ars": "no ARS agent in lightrl (a random search over linear policies, without gradients: no TorchRL loss)",
    "her": "hindsight relabelling of goal-conditioned replay is not built",
}


def not_mapped(algo: str) -> str:
    """The one line for an algorithm this command does not map."""
    reason = NOT_MAPPED.get(algo)
    return f"--algo {algo}: not mapped yet: {reason}" if reason else f"--algo {algo}: not mapped yet"


def render(config: dict[str, Node], indent: int = 0) -> list[str]:
    """YAML lines of ``config``, each value's comment beside it (column 32, as the shipped configs)."""
    lines = []
    for key, node in config.items():
        lines += _render_node(f"{' ' * indent}{key}:", node, indent)
    return lines


def _render_node(head: str, node: Node, indent: int) -> list[str]:
    if isinstance(node.children, dict):
        return [_commented(head, node.comment), *render(node.children, indent + 2)]
    if isinstance(node.children, list):
        lines = [_commented(head, node.comment)]
        for item in node.children:
            if isinstance(item, Node):  # a value: `- envs.gym.atari.FireReset  # comment`
                lines.append(_commented(f"{' ' * (indent + 2)}- {_text(item.value)}", item.comment))
                continue
            first, *rest = render(item, indent + 4)
            lines += [f"{' ' * (indent + 2)}- {first[indent + 4 :]}", *rest]
        return lines
    return [_commented(f"{head} {_text(node.value)}", node.comment)]


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_scalar(item)}" for key, item in value.items()) + "}"
    return _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        if "e" in text and "." not in text.split("e")[0]:  # YAML reads 1e-05 as a string: 1.0e-5
            mantissa, exponent = text.split("e")
            text = f"{mantissa}.0e{int(exponent)}"
        return text
    return str(value)


def _commented(line: str, comment: str) -> str:
    return f"{line:<31} # {comment}" if comment else line


def config_text(algo: str, env_id: str, out: Path, options: Options = Options()) -> str:
    """The text of ``out``: the config of the Zoo's ``algo`` entry of ``env_id``, its run named ``gym_<stem>``."""
    if algo not in MAPPED:
        raise ZooError(f"{not_mapped(algo)} (this command maps {', '.join(MAPPED)})")
    table = zoo_table(algo)
    entry = entry_id(table, algo, env_id)
    config = MAPPED[algo](dict(table[entry]), env_id, f"gym_{out.stem}", options)
    written_by = f"lightrl zoo --algo {algo} --env {env_id} --out {out}{options.flags()}"
    header = [
        f"# {env_id}, {display_name(algo)}: python -m app fit --config {out}",
        f"# Written by: {written_by}",
        f"# from the RL Zoo's tuned hyperparameters (DLR-RM/rl-baselines3-zoo, hyperparams/{algo}.yml, as rl_zoo3",
        f"# {zoo_version()} ships them); the Zoo's names are in the comments, and docs/guide/zoo.md says how each",
        "# is mapped.",
    ]
    if entry not in (env_id, "atari"):
        header.append(f"# The Zoo tunes this task as {entry}: that entry's numbers, on {env_id}.")
    if atari_game(env_id) is not None:
        header.append(
            "# Stable-Baselines3's AtariWrapper is written as Gymnasium's wrappers; that page says what differs."
        )
    return "\n".join([*header, *render(config)]) + "\n"


def zoo_tables() -> dict[str, dict[str, Any]]:
    """Every ``hyperparams/<algo>.yml`` of the installed Zoo: algorithm → its entries by environment id."""
    import yaml

    return {table.stem: yaml.safe_load(table.read_text()) for table in sorted(hyperparams_folder().glob("*.yml"))}


def installed(env_id: str) -> bool:
    """Whether ``env_id`` is a Gymnasium environment this machine can make (registered, its package present)."""
    import gymnasium

    try:
        with warnings.catch_warnings():  # an out-of-date version's deprecation is not this command's to print
            warnings.simplefilter("ignore")
            gymnasium.make(env_id).close()
    except Exception:  # unregistered, or its package (highway-env, pybullet, ...) missing
        return False
    return True


def pair_installed(env_id: str) -> bool:
    """Whether a table's ``env_id`` is installed here: :func:`installed`, or for ``atari``, whether ale-py registers
    its games (without starting an emulator, whose banner would be the command's output)."""
    return atari_game(ATARI_EXAMPLE) is not None if env_id == "atari" else installed(env_id)


def coverage() -> list[dict[str, Any]]:
    """Per algorithm of the Zoo: its (algorithm, environment) pairs, those whose environment is installed here, and
    those of these this command maps. ``atari``, the Zoo's entry for every Atari game, is one pair, installed with
    ale-py and mapped on :data:`ATARI_EXAMPLE`; ``default`` is no environment: not counted."""
    import gymnasium

    with contextlib.suppress(ImportError):
        import ale_py

        gymnasium.register_envs(ale_py)
    rows = []
    for algo, table in zoo_tables().items():
        pairs = [env_id for env_id in table if env_id != "default"]
        present = [env_id for env_id in pairs if pair_installed(env_id)]
        mapped, refused = [], {}
        for env_id in present if algo in MAPPED else []:
            try:
                MAPPED[algo](dict(table[env_id]), ATARI_EXAMPLE if env_id == "atari" else env_id, "coverage")
                mapped.append(env_id)
            except ZooError as error:
                refused[env_id] = str(error)
        row = {"algo": algo, "pairs": len(pairs), "installed": len(present), "mapped": mapped, "refused": refused}
        rows.append(row)
    return rows


def coverage_table(rows: list[dict[str, Any]]) -> str:
    """``coverage()`` as a Markdown table, with the totals, then each installed pair not mapped with its one line."""
    lines = ["| algorithm | pairs | environment installed | mapped |", "|---|---:|---:|---:|"]
    lines += [f"| {r['algo']} | {r['pairs']} | {r['installed']} | {len(r['mapped'])} |" for r in rows]
    totals = [sum(r[key] for r in rows) for key in ("pairs", "installed")] + [sum(len(r["mapped"]) for r in rows)]
    lines.append(f"| all | {totals[0]} | {totals[1]} | {totals[2]} |")
    lines += ["", "Installed pairs not mapped:"]
    for r in rows:
        if r["algo"] not in MAPPED and r["installed"]:
            lines.append(f"- {r['algo']} ({r['installed']} installed): {not_mapped(r['algo'])}")
        lines += [f"- {message}" for message in r["refused"].values()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = "lightrl zoo") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", help=f"the Zoo's algorithm ({', '.join(MAPPED)} are mapped)")
    parser.add_argument("--env", help="the Zoo's environment id, e.g. CartPole-v1")
    parser.add_argument("--out", type=Path, help="the config file to write (.yaml)")
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="instead: per algorithm, the Zoo's pairs, those whose environment is installed, and those mapped",
    )
    parser.add_argument(
        "--exact-updates",
        action="store_true",
        help=f"keep the Zoo's gradient_steps and batch_size as they are (default: rounds of more than "
        f"{MERGED_UPDATES} updates of small batches take half the updates of twice the batch)",
    )
    parser.add_argument(
        "--copies",
        type=int,
        metavar="N",
        help="off-policy entries: step each round as N copies together (a divisor of the round's train_freq x n_envs "
        "frames; faster on a batched environment, but not Stable-Baselines3's episodes). Default: the Zoo's n_envs",
    )
    args = parser.parse_args(argv)
    if args.copies is not None and args.copies < 1:
        parser.error(f"--copies {args.copies}: must be >= 1")
    if args.coverage:
        try:
            print(coverage_table(coverage()))
        except ZooError as error:
            parser.exit(1, f"{prog}: {error}\n")
        return
    missing = [f"--{name}" for name in ("algo", "env", "out") if getattr(args, name) is None]
    if missing:
        parser.error(f"{', '.join(missing)} required (or --coverage)")
    try:
        text = config_text(args.algo.lower(), args.env, args.out, Options(args.exact_updates, args.copies))
    except ZooError as error:
        parser.exit(1, f"{prog}: {error}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    temporary = args.out.with_name(f".{args.out.name}.tmp")
    temporary.write_text(text)
    temporary.replace(args.out)  # atomic: a reader never sees half a config
    print(f"{args.out}: the RL Zoo's {args.algo} {args.env} as a lightrl config (fit --config {args.out})")

"""Expert demonstrations as a Lightning data module: collected once, memory-mapped on disk, served in epochs.

``prepare_data`` drives the racing expert (:class:`~envs.racing.expert.TimeOptimalExpert`) on ``episodes``
cars at once for ``steps`` steps each and writes the (observation, action) pairs — with each car's ``arc``, the
privileged position the expert steered by — as a TensorDict memory-mapped under ``root``. The folder is named by a
hash of everything the data depends on (the environment's class and options, the expert's, the episode count and
length, the seed), so a changed option writes a new folder and an unchanged one reuses the old: later runs skip the
collection, and a stale file is never served. The folder appears under its final name only when complete (written
beside it, then renamed), and a folder that does not load (a crash mid-write elsewhere, a file removed or damaged) is
collected again.

``setup`` splits the pairs ``1 − val_fraction`` / ``val_fraction`` with a fixed seed; the loaders are standard
``DataLoader``s (workers and pinned memory are options; 0 workers and no pinning are fastest on this 2-core CPU, where
a batch is a slice of a memory-mapped tensor).

Each epoch's shuffle is seeded from the global torch generator, whose state Lightning's checkpoint does not hold: the
data module's own state is the global RNG states, applied when the first training epoch after a resume starts, so
``--ckpt_path last`` continues with the batches an uninterrupted run would have drawn.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from tensordict import TensorDict
from torch.utils.data import DataLoader, TensorDataset
from torchrl.envs import EnvBase

from datamodules.base import EnvSpecs, check_positive, rng_state, set_rng_state
from envs.racing.env import RacingEnv
from envs.racing.expert import TimeOptimalExpert

_COMPLETE = "complete.json"  # written last: its presence marks a whole collection


class DemonstrationDataModule(EnvSpecs, pl.LightningDataModule):
    """(observation, action) pairs of the racing expert, for behaviour cloning.

    Args:
        env: environment factory, called as ``env(num_envs=..., seed=..., device="cpu")`` (``class_path`` +
            ``init_args`` in YAML, like the RL data modules).
        episodes: cars driven at once, each from its own start: one episode each.
        steps: steps per episode (the reference's 100 episodes of ~500 steps: 50k pairs).
        root: folder under which collections are kept.
        batch_size: pairs per training batch.
        val_fraction: share of the pairs held out for validation.
        seed: seeds the starts (car ``i`` uses ``seed + i``), the action noise and the split. None: the run's
            ``seed_everything`` (0 for a data module built in code), as for the RL data modules.
        action_noise: standard deviations of Gaussian noise added to the actions the cars execute (acceleration
            m/s², steering rad), while the stored labels stay the expert's clean actions (DART, Laskey et al. 2017):
            the demonstrations then show how the expert recovers from small errors, which a cloned policy makes.
        num_workers, pin_memory: the loaders' options.
    """

    def __init__(
        self,
        env: Callable[..., EnvBase],
        episodes: int = 100,
        steps: int = 500,
        root: str = "runs/demonstrations",
        batch_size: int = 256,
        val_fraction: float = 0.1,
        seed: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        action_noise: Sequence[float] = (0.0, 0.0),
    ) -> None:
        super().__init__()
        check_positive("episodes", episodes)
        check_positive("steps", steps)
        check_positive("batch_size", batch_size)
        check_positive("num_workers", num_workers, allow_zero=True)
        if len(action_noise) != 2 or min(action_noise) < 0:
            raise ValueError(f"data.action_noise must be 2 values >= 0, got {list(action_noise)}")
        if not 0 < val_fraction < 1:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
        self.env_factory, self.episodes, self.steps = env, episodes, steps
        seed = 0 if seed is None else seed
        self.root, self.batch_size, self.val_fraction, self.seed = Path(root), batch_size, val_fraction, seed
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.action_noise = tuple(float(std) for std in action_noise)
        probe = self._probe(env, seed)
        if not isinstance(probe, RacingEnv):
            raise ValueError(f"data.env {type(probe).__name__}: the expert drives envs.racing.env.RacingEnv")
        self._env_options = {"class": f"{type(probe).__module__}.{type(probe).__qualname__}", **probe.init_kwargs()}
        self._expert_options = TimeOptimalExpert(probe).options
        probe.close()
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None
        self._pending_rng: dict[str, Any] | None = None  # a checkpoint's RNG states, until its first epoch starts

    def make_env(self, num_envs: int, seed: int) -> EnvBase:
        """Cars of the demonstrations' environment (closed-loop evaluation, export checks), on the CPU."""
        return self.env_factory(num_envs=num_envs, seed=seed, device="cpu")

    @property
    def pairs(self) -> int:
        return self.episodes * self.steps

    @property
    def path(self) -> Path:
        """The collection's folder: named by a hash of everything its contents depend on."""
        key = {
            "env": self._env_options,
            "expert": self._expert_options,
            "episodes": self.episodes,
            "steps": self.steps,
            "seed": self.seed,
            "action_noise": self.action_noise,
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()[:16]
        return self.root / f"demonstrations-{digest}"

    # ------------------------------------------------------------------------------------------------- collection
    def prepare_data(self) -> None:
        if self._load() is not None:
            return
        shutil.rmtree(self.path, ignore_errors=True)  # incomplete or damaged: collect again
        start = time.perf_counter()
        pairs = self.collect()
        seconds = time.perf_counter() - start
        partial = self.path.with_name(f"{self.path.name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        pairs.memmap(partial)
        (partial / _COMPLETE).write_text(
            json.dumps(
                {"pairs": self.pairs, "seconds": seconds, "env": self._env_options, "expert": self._expert_options},
                default=repr,
                indent=2,
            )
        )
        os.replace(partial, self.path)
        print(f"Demonstrations: {self.pairs:,} expert pairs collected in {seconds:.1f} s -> {self.path}")

    @torch.no_grad()
    def collect(self) -> TensorDict:
        """Drive the expert: ``[episodes * steps]`` pairs of ``observation``, ``action`` and ``arc``, episode-major."""
        env = self.env_factory(num_envs=self.episodes, seed=self.seed, device="cpu")
        expert = TimeOptimalExpert(env)
        noise = torch.tensor(self.action_noise)
        generator = torch.Generator().manual_seed(self.seed)
        td = env.reset()
        rows = []
        for _ in range(self.steps):
            td = expert(td)
            rows.append(td.select("observation", "action", "arc").clone())  # the label: the expert's clean action
            td["action"] = td["action"] + noise * torch.randn(td["action"].shape, generator=generator)
            td = env.step_and_maybe_reset(td)[1]
        return torch.stack(rows, 1).reshape(-1)

    def _load(self) -> TensorDict | None:
        """The collection on disk, or None when it is missing, incomplete or does not load whole."""
        if not (self.path / _COMPLETE).is_file():
            return None
        # Sizes first: mapping a truncated file would silently extend it with zeros.
        specs = {"observation": self._observation_spec["observation"], "action": self._action_spec}
        specs["arc"] = self._observation_spec["arc"]
        for key, spec in specs.items():
            file = self.path / f"{key}.memmap"
            if not file.is_file() or file.stat().st_size != self.pairs * spec.shape.numel() * spec.dtype.itemsize:
                return None
        try:
            pairs = TensorDict.load_memmap(self.path)
        except (OSError, RuntimeError, ValueError, KeyError, json.JSONDecodeError):
            return None
        if pairs.batch_size != torch.Size([self.pairs]) or set(pairs.keys()) != set(specs):
            return None
        return pairs

    # ------------------------------------------------------------------------------------------------- serving
    def setup(self, stage: str) -> None:
        pairs = self._load()
        if pairs is None:
            raise FileNotFoundError(f"no complete demonstrations at {self.path}: prepare_data() writes them")
        order = torch.randperm(self.pairs, generator=torch.Generator().manual_seed(self.seed))
        held_out = int(round(self.val_fraction * self.pairs))
        train, val = order[held_out:], order[:held_out]
        observation, action = pairs["observation"].clone(), pairs["action"].clone()
        self.train_set = TensorDataset(observation[train], action[train])
        self.val_set = TensorDataset(observation[val], action[val])

    def _loader(self, dataset: TensorDataset, shuffle: bool) -> DataLoader:
        # The training loader is the one whose epochs draw from the global generator that a resume must restore.
        loader = _EpochStartLoader if shuffle else DataLoader
        extra = {"on_epoch_start": self._restore_rng} if shuffle else {}
        return loader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            **extra,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    # ------------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        # Lightning saves last.ckpt after the epoch's validation and callbacks, so these are the states the next
        # epoch's loader starts from in an uninterrupted run.
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Not applied yet: Lightning restores the data module before the rest of fit's start (strategy and model
        # setup, on_fit_start hooks), which may draw from the same generators. The states are applied when the first
        # epoch's loader starts (_restore_rng), the point an uninterrupted run's next epoch starts from. (Lightning
        # 2.6 creates that loader before on_train_start: a draw in that hook would still move the stream.)
        self._pending_rng = state_dict["rng"]

    def _restore_rng(self) -> None:
        if self._pending_rng is not None:
            set_rng_state(self._pending_rng)
            self._pending_rng = None


class _EpochStartLoader(DataLoader):
    """A ``DataLoader`` that calls ``on_epoch_start`` before each epoch's iterator draws its seeds.

    Creating the iterator draws the loader's base seed (the workers' seeds) from the global generator, and its first
    batch draws the ``RandomSampler``'s shuffle seed: a state applied here precedes both. ``on_epoch_start`` is a
    constructor argument, so Lightning's re-instantiation of a loader (a distributed sampler) keeps it.
    """

    def __init__(self, *args: Any, on_epoch_start: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_epoch_start = on_epoch_start

    def __iter__(self) -> Iterator[Any]:
        self.on_epoch_start()
        return super().__iter__()

"""What an agent may ask of where its batches come from: the one interface between ``modules/`` and ``datamodules/``.

An agent (``modules/base.py::RLModule``) is typed against :class:`DataSource` and uses nothing else of its data
module; ``tests/app/test_layout.py`` checks that from the agents' source, and :class:`~datamodules.base.RLDataModule`
implements it. The loop an update sits in reads, in order::

    batch = next(training stream)          # Lightning's iterator: collects when nothing is ready
    loss = agent.update([batch])           # the agent's algorithm
    source.after_update(priorities)        # the hand-back: new priorities, weights to the collector
    while source.batches_ready: agent.update([source.next_ready_batch()])   # the rest of the round, same step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import Transform

if TYPE_CHECKING:
    from datamodules.timing import PhaseTimer
    from envs.base import EnvDeclaration


@runtime_checkable
class DataSource(Protocol):
    """Everything an update may ask of its data source, and nothing else.

    Attributes:
        declared: what the environment tells the agent (its physics, token layout, metrics; :class:`EnvDeclaration`).
        frames: environment frames this rank has collected: what schedules in frames follow (ε, the learning rate).
        timer: the run's phase timer; the update times itself into its ``update`` phase.
        batches_ready: training batches that can be served without collecting (the rest of a round or a rollout).
        prioritized: whether batches carry priorities, which :meth:`after_update` takes back (prioritized replay).
        prefetch: whether the next round is prepared in a background thread beside the updates.
        bptt: the length of the sequences a batch holds (recurrent policies); 0: single transitions.
        updates_per_rollout: the updates each on-policy rollout serves (its epochs of minibatches); None where the
            batches are drawn from a replay buffer.
    """

    declared: EnvDeclaration
    frames: int
    timer: PhaseTimer

    @property
    def batches_ready(self) -> int: ...

    @property
    def prioritized(self) -> bool: ...

    @property
    def prefetch(self) -> bool: ...

    @property
    def bptt(self) -> int: ...

    @property
    def updates_per_rollout(self) -> int | None: ...

    def use_env_transform(self, transform: Transform | None) -> None:
        """A transform the agent's policy needs on every environment it acts in (a recurrent state's primer)."""

    def connect(
        self,
        policy: TensorDictModuleBase,
        postprocess: Callable[[TensorDictBase], Any] | None = None,
        batch_keys: Sequence[NestedKey] | None = None,
        store_transform: Transform | None = None,
    ) -> None:
        """The acting policy, the in-place work on each collected batch, the entries the update reads, and a
        transform of the transitions before they are stored (n-step returns)."""

    def next_ready_batch(self) -> TensorDictBase:
        """The next of the :attr:`batches_ready`."""

    def next_batch(self) -> TensorDictBase:
        """The next training batch, collecting a round when none is ready (what the training stream serves)."""

    def after_update(self, priority: torch.Tensor | None = None) -> None:
        """The hand-back after each update: its per-sample TD errors (new priorities), and the weights pushed where
        the collector keeps its own copy."""

    def monitor(self) -> dict[str, float]:
        """Figures about the data path that the update logs with its losses."""

    def evaluate(self, policy: TensorDictModuleBase) -> dict[str, float]:
        """Greedy evaluation episodes of ``policy`` (``validate``)."""


#: The members of :class:`DataSource`: all that an agent's file may read of its data module.
DATA_SOURCE_MEMBERS = frozenset(
    name for name in (*DataSource.__annotations__, *vars(DataSource)) if not name.startswith("_")
)

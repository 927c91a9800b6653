"""Training-episode statistics: the return, length and episode metrics of the training episodes that ended.

Every collected batch passes :meth:`EpisodeStatistics.observe`, whatever collects it (in this process, environment
workers, collector workers, a prefetch thread, asynchronous workers): each environment's (each agent's) running sums
of ``next/reward``, of its steps and of the environment's ``episode_metric_keys`` continue over the batch's steps,
and the sums of the episodes that end in it (``next/done``) are set aside. They count once the data module counts the
batch's frames (:meth:`EpisodeStatistics.count`: a prefetched round counts when the training thread takes it), and
:meth:`EpisodeStatistics.report` turns those counted since the last report into means: ``train/return_mean``,
``train/length_mean``, ``train/<metric>_mean`` (the evaluation's names under ``eval/``), and ``data/episodes``, all
episodes ended so far.

The running sums are part of the data module's state, so a resumed run continues the episodes' sums where the
checkpointed run stood; so are the ended episodes not yet reported and the last report's means (repeated while no
episode ends), so the resumed run logs what the uninterrupted one does. An environment that ends its episodes on
loading (``BatchedEnv.exact_state`` False), and asynchronous workers (which start new episodes), start their sums
afresh instead.

The work is a fixed number of whole-batch tensor operations per batch, on the batch's device; the figures reach the
host only at :meth:`report`, on logging steps. On the CPU, where reading a flag costs nothing, a batch in which no
episode ends (most rounds of a few steps) only carries the running sums on, to the same bits.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from compat.torchrl import WORKER_KEY


class EpisodeStatistics:
    """Running sums per environment row and the figures of the episodes that ended.

    Args:
        metric_keys: the environment's ``episode_metric_keys``: per-step entries summed over an episode.
        metric_over: the environment's ``episode_metric_over``: ``{metric: marker}``, ``metric`` averaged over the
            episodes whose ``marker`` sum is positive only (racing: ``lap_time`` over the episodes with a lap).
        rows: environment rows of a whole batch (``num_envs × agents_per_env``).
        agents_per_env: agents of one environment; an environment's agents end their episodes together, so one
            episode is ``agents_per_env`` ended rows, and every figure is per agent.
    """

    def __init__(self, metric_keys: tuple[str, ...], metric_over: Mapping[str, str], rows: int, agents_per_env: int):
        self.metric_keys, self.rows, self.agents = tuple(metric_keys), rows, agents_per_env
        # Columns of the sums: return, length, then each metric.
        self.names = ("return", "length", *self.metric_keys)
        # Each metric averaged over marked episodes only: (its column, its marker's column).
        self._over = [(self.names.index(key), self.names.index(marker)) for key, marker in metric_over.items()]
        self.running: torch.Tensor | None = None  # [rows, columns]: the running episodes' sums
        # Ended episodes' totals: [ended rows, the column sums, then the marked episodes' count per _over entry]
        self.pending: torch.Tensor | None = None  # in batches collected and not yet counted
        self.counted: torch.Tensor | None = None  # counted and not yet reported
        self.episodes = 0.0  # ended episodes reported so far
        self.last: dict[str, float] = {}  # the means of the last report that had ended episodes
        self._lock = threading.Lock()  # asynchronous workers' batches are observed in the feeder thread

    @property
    def _width(self) -> int:
        return 1 + len(self.names) + len(self._over)

    def _zeros(self, device: torch.device) -> None:
        if self.running is None or self.running.device != device:
            self.running = torch.zeros(self.rows, len(self.names), device=device)
            self.pending = torch.zeros(self._width, device=device)
            self.counted = torch.zeros(self._width, device=device)

    def observe(self, batch: TensorDictBase) -> None:
        """Continue the running sums over ``batch`` (``[*envs, steps]``: every row's, or one asynchronous worker's
        rows, named by ``WORKER_KEY``) and set aside the sums of the episodes that ended in it."""
        steps = batch.shape[-1]
        done = batch.get(("next", "done")).reshape(-1, steps)
        columns = [batch.get(("next", "reward")).reshape(-1, steps).float(), torch.ones_like(done, dtype=torch.float)]
        columns += [batch.get(("next", key)).reshape(-1, steps).float() for key in self.metric_keys]
        values = torch.stack(columns, dim=-1)  # [rows, steps, columns]
        worker = batch.get(WORKER_KEY, None)
        with self._lock:
            self._zeros(values.device)
            rows = slice(None)
            if worker is not None:
                first = int(worker.reshape(-1)[0]) * done.shape[0]
                rows = slice(first, first + done.shape[0])
            if done.device.type == "cpu" and not bool(done.any()):
                # No episode ends in the batch (most rounds of a few steps): the running sums go on, as the general
                # road's last column computes them, in two operations where it takes a score of them (a host read
                # here costs nothing; on an accelerator it would wait for the batch, so that road stays whole-batch).
                self.running[rows] += values.cumsum(1)[:, -1]
                return
            self.running[rows], ended = _episode_sums(self.running[rows], values, done)
            sums, marked = ended.sum(0), []
            for column, marker in self._over:  # a marked metric's sum counts only its marked episodes
                counts = ended[:, marker] > 0  # ended is zero but where an episode ends
                sums[column] = (ended[:, column] * counts).sum()
                marked.append(counts.sum().float().reshape(1))
            self.pending += torch.cat([done.sum().float().reshape(1), sums, *marked])

    def count(self) -> None:
        """The batches observed so far are counted (their frames are): their ended episodes join the next report."""
        with self._lock:
            if self.pending is not None:
                self.counted += self.pending
                self.pending.zero_()

    def report(self) -> dict[str, float]:
        """Means over the episodes counted since the last report and ``data/episodes``; when none ended, the last
        report's means again (what a logger shows until new ones come: kept in the state, so a resumed run logs
        what the uninterrupted one does)."""
        if self.counted is None:
            return {**self.last, "data/episodes": self.episodes}
        with self._lock:
            totals = self.counted.tolist()
            self.counted.zero_()
        ended, sums, marked = totals[0], totals[1 : 1 + len(self.names)], totals[1 + len(self.names) :]
        self.episodes += ended / self.agents
        if ended:
            figures = {f"train/{name}_mean": total / ended for name, total in zip(self.names, sums, strict=True)}
            for (column, _), count in zip(self._over, marked, strict=True):
                # NaN when no episode counts: a missing point of the curve, not a zero (as the evaluation's)
                figures[f"train/{self.names[column]}_mean"] = sums[column] / count if count else float("nan")
            self.last = figures
        return {**self.last, "data/episodes": self.episodes}

    def state_dict(self) -> dict[str, Any]:
        """Copies taken under the lock: asynchronous workers' batches go on being observed, in place, while a
        checkpoint is written (a live tensor would be saved torn)."""
        with self._lock:
            copies = {
                key: None if value is None else value.clone()
                for key, value in (("running", self.running), ("pending", self.pending), ("counted", self.counted))
            }
        return {**copies, "episodes": self.episodes, "last": dict(self.last)}

    def load_state_dict(self, state: dict[str, Any], running: bool, device: torch.device) -> None:
        """Restore ``state``; the running sums only where ``running`` (the environments continue their episodes)."""
        self.running = self.pending = self.counted = None
        self.episodes, self.last = state["episodes"], dict(state.get("last", {}))  # older checkpoints have none
        if state["counted"] is None:
            return
        self._zeros(device)
        self.pending.copy_(state["pending"])
        self.counted.copy_(state["counted"])
        if running:
            self.running.copy_(state["running"])


def _episode_sums(running: torch.Tensor, values: torch.Tensor, done: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Continue ``running`` (``[rows, columns]``) over ``values`` (``[rows, steps, columns]``) whose episodes end
    where ``done`` (``[rows, steps]``); returns the new running sums and each step's ended-episode sums
    (``[rows × steps, columns]``, zero where no episode ends).

    Whole-batch: ``S[t]``, the running sums plus the values up to step ``t``, less ``S`` at the row's previous end
    (zero before the batch's first end, whose episode includes the running sums) is the sum of the episode ending at
    ``t``."""
    rows, steps, columns = values.shape
    if steps == 1:  # a round of one step (one-frame rounds: most off-policy runs): the same numbers in three ops
        cumulative = running + values[:, 0]
        return torch.where(done, cumulative - cumulative, cumulative), cumulative * done
    cumulative = running.unsqueeze(1) + values.cumsum(1)  # S
    index = torch.arange(steps, device=values.device).expand(rows, steps)
    last_end = torch.where(done, index, -1).cummax(1).values  # each step's latest end, itself included
    previous_end = torch.cat([last_end.new_full((rows, 1), -1), last_end[:, :-1]], 1)
    # The episode of a step started after previous_end; a pad column of zeros stands for "no end yet" (index -1).
    padded = torch.cat([values.new_zeros(rows, 1, columns), cumulative], 1)
    before = padded.gather(1, (previous_end + 1).unsqueeze(-1).expand(rows, steps, columns))
    ended = (cumulative - before) * done.unsqueeze(-1)
    at_last_end = padded.gather(1, (last_end[:, -1:] + 1).unsqueeze(-1).expand(rows, 1, columns)).squeeze(1)
    return cumulative[:, -1] - at_last_end, ended.reshape(rows * steps, columns)

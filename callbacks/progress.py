"""RLProgressBar: Lightning's TQDM bar, counting updates and showing what an RL run is judged by.

Registered by default by the command line (``app/cli.py``), so every agent and config gets it without listing it;
``--trainer.enable_progress_bar false`` turns it off.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar

from callbacks.schedule import PeriodicEvaluation
from compat.lightning import progress_bar_leaves

# Module-level so tests can drive time by hand; looked up at each call, never bound at import.
_clock = time.perf_counter

# (history key, label on the bar, format) of the latest evaluation's figures, shown when present.
EVALUATION_ITEMS = (
    ("eval/return_mean", "return", "{:.2f}"),
    ("eval/food_mean", "food", "{:.2f}"),
    ("eval/safety_mae", "safety_mae", "{:.3f}"),
)
# (logged key, label on the bar, format) of the training episodes ended before the latest logging step, shown once
# some have (datamodules/episodes.py): the curve users watch first, long before an evaluation.
TRAINING_ITEMS = (
    ("train/return_mean", "ep_return", "{:.2f}"),
    ("train/length_mean", "ep_length", "{:.0f}"),
)


def compact(value: float) -> str:
    """A count or rate in at most four significant characters: ``950``, ``12.5``, ``14.8k``, ``1.23M``."""
    for threshold, unit, suffix in ((1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / unit:.3g}{suffix}"
    return f"{value:.0f}" if abs(value) >= 100 or float(value).is_integer() else f"{value:.3g}"


class RLProgressBar(TQDMProgressBar):
    """The training bar counts updates (towards ``max_steps``) and shows ``frames``, ``frames/s``, ``updates/s``,
    the training episodes' mean return and length as last logged (``ep_return``, ``ep_length``), the latest
    evaluation (``return``; ``food`` for Snake, ``safety_mae`` for PIRL) and what the model logs with
    ``prog_bar=True`` (``train/loss``).

    The loop runs up to thousands of updates a second, and redrawing a terminal line costs about as much as a small
    update, so the bar redraws at most every ``refresh_s`` seconds whatever the step rate (Lightning's bar redraws
    every ``refresh_rate`` steps); between redraws a step costs one clock read. The first step is drawn at once.
    Rates are over the last ``window_s`` seconds (at least one redraw back): an on-policy run collects in bursts, so
    a shorter window would swing between zero and a spike.

    Args:
        refresh_s: seconds between redraws.
        window_s: seconds the rates are averaged over.
        process_position: line offset of the bar (as in ``TQDMProgressBar``).
        leave: keep the finished bar on screen (as in ``TQDMProgressBar``).
    """

    #: the training bar's format: no it/s (updates/s is in the postfix, over a window), the unit spelled out.
    TRAIN_BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} updates [{elapsed}<{remaining}{postfix}]"

    def __init__(
        self, refresh_s: float = 0.5, window_s: float = 10.0, process_position: int = 0, leave: bool = False
    ) -> None:
        if not refresh_s > 0:
            raise ValueError(f"RLProgressBar refresh_s must be > 0, got {refresh_s}")
        if not window_s > 0:
            raise ValueError(f"RLProgressBar window_s must be > 0, got {window_s}")
        super().__init__(refresh_rate=1, process_position=process_position, leave=leave)
        self.refresh_s, self.window_s = refresh_s, window_s
        self.redraws = 0  # training-bar redraws so far (the cost the refresh interval bounds)
        self._next_redraw = 0.0
        self._points: deque[tuple[float, int, int]] = deque()  # (time, frames, updates) at train start and redraws
        self._rates: dict[str, str] = {}
        self._evaluation: PeriodicEvaluation | None = None

    def init_train_tqdm(self) -> Any:
        bar = super().init_train_tqdm()
        bar.bar_format = self.TRAIN_BAR_FORMAT
        return bar

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._evaluation = next((cb for cb in trainer.callbacks if isinstance(cb, PeriodicEvaluation)), None)
        self._points = deque([(_clock(), self._frames(trainer), trainer.global_step)])
        self._next_redraw = 0.0
        # A run resumed from a checkpoint continues its epoch without `on_train_epoch_start`: count from here too.
        self._count_updates(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if progress_bar_leaves(self):
            self.train_progress_bar = self.init_train_tqdm()
        self._count_updates(trainer)

    def _count_updates(self, trainer: pl.Trainer) -> None:
        # Not Lightning's "Epoch N" over the batches of an epoch: an RL stream has no epochs, so the bar counts
        # updates, from where a resumed run stands, to max_steps.
        bar = self.train_progress_bar
        bar.reset()
        bar.total = trainer.max_steps if trainer.max_steps > 0 else None
        bar.initial = bar.n = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        now = _clock()
        if now >= self._next_redraw:
            self._redraw(trainer, pl_module, now)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._redraw(trainer, pl_module, _clock())  # the final figures, whatever the time since the last redraw
        if progress_bar_leaves(self):
            self.train_progress_bar.close()

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """What the bar shows; Lightning's ``v_num`` (the logger's version) is left out."""
        items: dict[str, Any] = {"frames": compact(self._frames(trainer)), **self._rates}
        logged = trainer.callback_metrics
        items.update({label: form.format(float(logged[key])) for key, label, form in TRAINING_ITEMS if key in logged})
        history = self._evaluation.history if self._evaluation is not None else []
        if history:
            latest = history[-1]
            items.update({label: form.format(latest[key]) for key, label, form in EVALUATION_ITEMS if key in latest})
        items.update(trainer.progress_bar_metrics)
        return items

    def _redraw(self, trainer: pl.Trainer, pl_module: pl.LightningModule, now: float) -> None:
        self._next_redraw = now + self.refresh_s
        bar = self.train_progress_bar
        if bar.disable:
            return
        frames, updates = self._frames(trainer), trainer.global_step
        while len(self._points) > 1 and self._points[1][0] <= now - self.window_s:
            self._points.popleft()  # the oldest point kept is the newest one at least window_s old
        then, frames_then, updates_then = self._points[0]
        if now > then:
            self._rates = {
                "frames/s": compact((frames - frames_then) / (now - then)),
                "updates/s": compact((updates - updates_then) / (now - then)),
            }
        self._points.append((now, frames, updates))
        bar.n = updates
        bar.set_postfix(self.get_metrics(trainer, pl_module))  # one terminal write: set_postfix refreshes
        self.redraws += 1

    @staticmethod
    def _frames(trainer: pl.Trainer) -> int:
        # Every rank collects alike: rank zero's count times the world size, as the throughput report counts.
        return trainer.datamodule.frames * trainer.world_size

"""Videos of greedy evaluation episodes: MP4 files written by ffmpeg (``imageio-ffmpeg``), and
:class:`EvaluationVideo`, which records some every N frames of training.

The frames are the environment's own drawing (``BatchedEnv.render``); environments that cannot draw themselves
(``can_render`` False) make no video, and asking for one is an error before anything runs. The encoder is an
optional extra: ``pip install -e ".[video]"`` from a checkout.

Encoding: H.264 in yuv420p, the format every player and browser (and W&B) shows, at ``CRF`` 18 (x264's
"visually lossless"): colours are stored at half resolution and rounded, so a decoded frame is close to, not equal
to, the drawn one (``tests/app/test_video.py`` measures how close).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from callbacks.schedule import FrameSchedule
from compat.extras import install_command
from envs.base import cannot_render

#: how to get the encoder, for the error line when it is missing.
#: x264's constant rate factor: 0 lossless … 51 worst; 18 is its "visually lossless".
CRF = 18


def encoder_missing() -> str | None:
    """Why MP4 cannot be written here (the encoder package is not installed), or None when it can."""
    try:
        import imageio_ffmpeg  # noqa: F401  (the ffmpeg binary comes with it)
    except ImportError:
        hint = f'{install_command("video")} (or pip install "imageio[ffmpeg]")'
        return f"writing MP4 needs imageio-ffmpeg, which is not installed: {hint}"
    return None


class VideoWriter:
    """An MP4 file written frame by frame: ``with VideoWriter(path, fps) as video: video.append(rgb)``.

    Every frame must have the first one's size; an odd height or width is padded with one black row or column
    (yuv420p stores colour per 2×2 pixels).
    """

    def __init__(self, path: str | Path, fps: int) -> None:
        self.path, self.fps, self.frames = Path(path), fps, 0
        self._shape: tuple[int, ...] | None = None
        self._encoder: Any = None

    def append(self, frame: np.ndarray) -> None:
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"a video frame is uint8 [height, width, 3], got {frame.dtype} {list(frame.shape)}")
        if self._shape is None:
            self._open(frame.shape)
        elif frame.shape != self._shape:
            raise ValueError(f"video frames must keep one size: {list(self._shape)}, then {list(frame.shape)}")
        height, width = frame.shape[:2]
        padded = np.zeros((height + height % 2, width + width % 2, 3), dtype=np.uint8)
        padded[:height, :width] = frame
        self._encoder.send(padded.tobytes())
        self.frames += 1

    def _open(self, shape: tuple[int, ...]) -> None:
        import imageio_ffmpeg

        self._shape = shape
        self.path.parent.mkdir(parents=True, exist_ok=True)
        height, width = shape[0] + shape[0] % 2, shape[1] + shape[1] % 2
        self._encoder = imageio_ffmpeg.write_frames(
            str(self.path),
            (width, height),
            fps=self.fps,
            codec="libx264",
            pix_fmt_out="yuv420p",
            quality=None,  # the rate is set below
            output_params=["-crf", str(CRF)],
            macro_block_size=1,  # sizes are even already: never rescaled
        )
        self._encoder.send(None)  # starts ffmpeg

    def close(self) -> None:
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def record_video(
    datamodule: Any,
    policy: Callable[[Any], Any],
    path: str | Path,
    episodes: int,
    fps: int,
    max_frames: int | None = None,
) -> list[dict[str, float]]:
    """Greedy episodes ``0 … episodes - 1`` of ``policy`` in ``datamodule``'s evaluation environments (the episodes
    its evaluations play: :meth:`~datamodules.evaluation.Evaluation.record`), one after the other, into the MP4
    file ``path``. Returns each episode's ``return``, ``length`` and ``frames``."""
    if not datamodule.declared.can_render:
        raise ValueError(cannot_render(datamodule.declared.env_class))
    with VideoWriter(path, fps) as video:
        return datamodule.record(policy, episodes, video.append, max_frames)


class EvaluationVideo(FrameSchedule):
    """Records ``episodes`` greedy evaluation episodes to ``<run folder>/videos/frames_<N>.mp4`` every
    ``every_n_frames`` frames of training (``N``: frames so far) and at the end, and hands each file to the loggers
    that take videos (those with a ``log_video`` method, such as Lightning's ``WandbLogger``).

    The episodes are the evaluation's first ``episodes`` (same seeds), so a video shows what
    ``eval/return_mean`` measured. Its time is the data module's ``eval`` phase. The schedule's position is saved
    in checkpoints: a resumed run records at the frames it would have.

    Args:
        every_n_frames: frames between videos.
        episodes: episodes per video, one after the other.
        fps: frames per second of the video (one frame per environment step).
        max_frames: the most frames recorded of one episode; None: whole episodes (a long one makes a large file).
        at_start: also record before the first update (the untrained policy).
        dirpath: where the videos go; default ``<log_dir>/videos`` (``default_root_dir`` without a logger).
    """

    def __init__(
        self,
        every_n_frames: int = 500_000,
        episodes: int = 1,
        fps: int = 30,
        max_frames: int | None = 1_000,
        at_start: bool = False,
        dirpath: str | None = None,
    ) -> None:
        super().__init__(every_n_frames, at_start)
        for name, value in (("episodes", episodes), ("fps", fps)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames must be >= 1 or null, got {max_frames}")
        missing = encoder_missing()
        if missing:
            raise ValueError(missing)
        self.episodes, self.fps, self.max_frames, self.dirpath = episodes, fps, max_frames, dirpath
        self.videos: list[str] = []  # the files written by this process
        self._dir: Path | None = None

    def check_datamodule(self, datamodule: Any) -> None:
        """Raise a ValueError when ``datamodule``'s environment cannot be drawn (the CLI calls this before the
        trainer exists, so nothing is written)."""
        declared = getattr(datamodule, "declared", None)
        if declared is None or not declared.can_render:
            raise ValueError(cannot_render(type(datamodule) if declared is None else declared.env_class))

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.check_datamodule(trainer.datamodule)
            # Resolved on every rank: trainer.log_dir broadcasts, so rank zero alone would wait for the others forever.
            self._dir = Path(self.dirpath or Path(trainer.log_dir or trainer.default_root_dir) / "videos")

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        frames = self._last_frames
        if not trainer.is_global_zero:  # one video per run: rank 0's episodes
            return
        path = self._dir / f"frames_{frames}.mp4"
        with trainer.datamodule.timer.phase("eval"):
            was_training = pl_module.training
            pl_module.eval()
            try:
                results = record_video(
                    trainer.datamodule, pl_module.greedy_policy(), path, self.episodes, self.fps, self.max_frames
                )
            finally:
                pl_module.train(was_training)
        self.videos.append(str(path))
        returns = ", ".join(f"{result['return']:.4g}" for result in results)
        rank_zero_info(f"Video of {len(results)} evaluation episode(s) at {frames:,} frames, returns {returns}: {path}")
        for logger in trainer.loggers:
            log_video = getattr(logger, "log_video", None)
            if callable(log_video):  # WandbLogger: one list entry per video, with its fps and format
                log_video("eval/video", [str(path)], step=trainer.global_step, fps=[self.fps], format=["mp4"])

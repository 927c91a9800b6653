"""``python -m app watch``: play a trained policy's greedy episodes and write them as an MP4 video.

Commands::

    python -m app watch --ckpt_path runs/snake_dqn/version_0 --episodes 3          # the run's last.ckpt
    python -m app watch --ckpt_path runs/racing_sac/version_0/checkpoints/last.ckpt --out lap.mp4 --fps 50

The model and data module are rebuilt from the run's ``config.yaml`` (or ``--config``) as ``fit`` builds them, the
checkpoint's weights loaded, and the data module's evaluation episodes ``0 … episodes - 1`` played (the episodes
its evaluations score) and drawn by the environment's ``render`` (callbacks/video.py writes the file). Flags it does
not know (``--data.init_args.env.init_args.size 12``) override the config.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from app.errors import OneLineArgumentParser
from app.trained import load_trained, run_folder_of
from callbacks.video import encoder_missing, record_video
from envs.base import cannot_render


def main(argv: Sequence[str] | None = None, prog: str = "lightrl watch") -> Path:
    """Parses ``argv`` (default ``sys.argv[1:]``), writes the video and returns its path. Bad input exits with
    status 2 and one line ``<prog>: error: ...`` naming the flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineArgumentParser(
        prog=prog,
        description="Play a checkpoint's greedy policy in its evaluation environments and write an MP4 video.",
        allow_abbrev=False,  # the unknown flags go to the model's config: never guess which of ours they abbreviate
    )
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint (.../checkpoints/last.ckpt) or a run folder")
    parser.add_argument("--episodes", type=int, default=3, help="episodes, one after the other (default 3)")
    parser.add_argument("--out", default=None, help="the video file; default <run folder>/videos/watch_<ckpt>.mp4")
    parser.add_argument("--fps", type=int, default=30, help="frames per second; one frame per step (default 30)")
    parser.add_argument(
        "--max_frames", type=int, default=None, help="the most frames of one episode; default whole episodes"
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="the training config(s), composed in order; default the run's saved config.yaml near the checkpoint",
    )
    args, overrides = parser.parse_known_args(argv)

    for name in ("episodes", "fps", "max_frames"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    if args.out is not None and Path(args.out).suffix.lower() != ".mp4":
        parser.error(f"--out {args.out}: the video is MP4; name a .mp4 file")
    missing = encoder_missing()
    if missing:
        parser.error(f"--out: {missing}")
    checkpoint = Path(args.ckpt_path)
    if checkpoint.is_dir():  # a run folder: its last checkpoint
        checkpoint = checkpoint / "checkpoints" / "last.ckpt"
        if not checkpoint.is_file():
            parser.error(f"--ckpt_path {args.ckpt_path}: a folder without checkpoints/last.ckpt (not a run folder)")
    elif not checkpoint.is_file():
        parser.error(f"--ckpt_path {checkpoint}: no such file or run folder")
    model, datamodule, _ = load_trained(parser, "--ckpt_path", checkpoint, args.config, overrides)
    if not datamodule.declared.can_render:
        parser.error(f"--ckpt_path {checkpoint}: {cannot_render(datamodule.declared.env_class)}")
    # The policy may need a transform on every environment it acts in (a recurrent policy's state primer), as its
    # own setup hands over when a trainer runs it.
    env_transform = getattr(model, "env_transform", None)
    datamodule.use_env_transform(env_transform() if callable(env_transform) else None)
    model.eval()
    out = Path(args.out) if args.out else run_folder_of(checkpoint) / "videos" / f"watch_{checkpoint.stem}.mp4"
    results = record_video(datamodule, model.greedy_policy(), out, args.episodes, args.fps, args.max_frames)
    for episode, result in enumerate(results):
        print(f"episode {episode}: return {result['return']:.4g}, {result['length']} steps")
    print(f"Wrote {out} ({sum(result['frames'] for result in results)} frames at {args.fps} fps)")
    return out

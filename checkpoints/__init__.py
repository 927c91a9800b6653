"""Checkpoint files, in one room: writing atomically with each file's SHA-256 (``files.py``: ``save_atomically``,
folders written whole, the disk's free space checked first; ``io.py``: ``AtomicCheckpointIO``, Lightning's plugin
writing checkpoints that way), the names and per-rank layout of the files kept beside a checkpoint (replay buffers,
other ranks' states), verifying them, and choosing what a resume loads (``resume.py``: the newest sound ``last``
checkpoint, falling back past damaged ones). ``CheckpointMismatch`` is the one error for a checkpoint that does not fit
the run. Callbacks (``FrameCheckpoint``), data modules, agents and the command line call these; nothing here imports
them.
"""

"""The batched environments, one sub-package per family; ``base.py`` is the contract every environment follows.

``snake/`` Snake (its CPU kernel beside it); ``safety/`` PIRL's finite-horizon safety tasks (the vehicle, the authors'
2-D toy, their shared base and dynamics); ``racing/`` race cars (the track, the expert driver); ``mettagrid/`` the
compiled multi-agent grid world (its token layout); ``mario/`` the NES emulator (its NumPy-2 layer); ``gym/`` any
registered Gymnasium id; ``testing/`` tiny worlds for fast tests. ``counter_rng.py``: the counter-based random
streams several families draw from. An environment's class path names its module:
``envs.snake.env.SnakeEnv``.
"""

"""MettaGrid: the compiled grid world as a batched environment (``env.py``, needs the ``mettagrid`` package) and the
token observations' layout (``tokens.py``, needs nothing)."""

"""Tiny worlds for fast tests of the data paths and agents: the chain walk (``chain.py``) and cue recall
(``recall.py``)."""

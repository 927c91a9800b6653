"""Gymnasium: any registered id as a batched environment (``env.py``), built with one-line errors (``make.py``)."""

"""Gymnasium: any registered id as a batched environment (``env.py``), built with one-line errors (``make.py``);
envpool's C++ tasks as a second engine (``envpool_env.py``); what the two share (``copies.py``)."""

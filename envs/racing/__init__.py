"""Racing: the cars (``env.py``), the spline track (``track.py``) and the expert driver (``expert.py``)."""

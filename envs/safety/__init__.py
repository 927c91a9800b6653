"""PIRL's finite-horizon safety tasks: the shared rules (``base.py``), their dynamics (``physics.py``), the vehicle
(``vehicle.py``) and the authors' 2-D toy (``toy.py``)."""

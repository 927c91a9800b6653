"""Super Mario Bros on the NES emulator (``env.py``) and the layer that runs the emulator under NumPy 2
(``nes_compat.py``); both need the ``mario`` extra."""

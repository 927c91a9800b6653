"""Imported for its effect, by the forkserver that starts the worker processes and by nothing else: the server, and
every worker it forks, ignores SIGTERM (a list of modules to import is a server's only hook:
:data:`datamodules.workers.WORKER_IMPORTS`; a worker started otherwise ignores it when it builds its environments).

A SIGTERM sent to the run's whole process group (``kill -TERM -- -PGID``, GNU ``timeout``, a service manager or a
scheduler that signals every process of the job) reaches the workers and the server with the learner. The learner
stops after its update, saves a checkpoint that asks every worker for its state, then closes the workers (TorchRL's
close message, SIGKILL past its deadline); a worker, or the server whose children they are, that had ended on the
signal first would take that checkpoint with it.
"""

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)

"""jsonargparse's private API: how it decides whether a class's options are those of ``__new__`` or ``__init__``.

TorchRL's ``EnvBase`` defines ``__new__`` as a classmethod; jsonargparse compares bound methods by identity, concludes
that every environment subclass overrides ``__new__``, and reads its ``(*args, **kwargs)`` instead of the
environment's ``__init__``. Environment options (``--data.init_args.env.init_args.size``) are then neither documented
nor checked. :func:`read_init_of_subclasses` makes it read ``__init__`` for the subclasses of a given class, by
replacing ``jsonargparse._parameter_resolvers.has_dunder_new_method``, the module-level function it looks up on every
use.
"""

from __future__ import annotations

import inspect

from jsonargparse import _parameter_resolvers

DISTRIBUTION = "jsonargparse"
#: The jsonargparse version every function here was written against (tests/app/test_compat.py: same minor, any patch).
WRITTEN_AGAINST = "4.53.0"

#: Every private name used here: (where it lives, the name, the function of this module that uses it).
PRIVATE_API = (
    ("jsonargparse", "_parameter_resolvers", "read_init_of_subclasses"),
    ("jsonargparse._parameter_resolvers", "has_dunder_new_method", "read_init_of_subclasses"),
)


def read_init_of_subclasses(base: type) -> None:
    """From now on (process-wide), jsonargparse reads the options of ``base`` and its subclasses from ``__init__``,
    whatever their ``__new__``; other classes as before."""
    # jsonargparse._parameter_resolvers.has_dunder_new_method(cls, attr_name) (private; jsonargparse 4.53.0).
    has_dunder_new_method = _parameter_resolvers.has_dunder_new_method

    def reads_init_of_subclasses(cls, attr_name: str) -> bool:
        if inspect.isclass(cls) and issubclass(cls, base):
            return False
        return has_dunder_new_method(cls, attr_name)

    _parameter_resolvers.has_dunder_new_method = reads_init_of_subclasses

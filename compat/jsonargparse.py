"""jsonargparse's private API: how it decides whether a class's options are those of ``__new__`` or ``__init__``,
and what a lazy instance is made of.

TorchRL's ``EnvBase`` defines ``__new__`` as a classmethod; jsonargparse compares bound methods by identity, concludes
that every environment subclass overrides ``__new__``, and reads its ``(*args, **kwargs)`` instead of the
environment's ``__init__``. Environment options (``--data.init_args.env.init_args.size``) are then neither documented
nor checked. :func:`read_init_of_subclasses` makes it read ``__init__`` for the subclasses of a given class, by
replacing ``jsonargparse._parameter_resolvers.has_dunder_new_method``, the module-level function it looks up on every
use.

:func:`lazy_instance` is jsonargparse's own, told the module the default belongs to instead of finding it.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, TypeVar

from jsonargparse import _parameter_resolvers
from jsonargparse.typing import _LazyInitBaseClass

DISTRIBUTION = "jsonargparse"
#: The jsonargparse version every function here was written against (tests/app/test_compat.py: same minor, any patch).
WRITTEN_AGAINST = "4.53.0"

#: Every private name used here: (where it lives, the name, the function of this module that uses it).
PRIVATE_API = (
    ("jsonargparse", "_parameter_resolvers", "read_init_of_subclasses"),
    ("jsonargparse._parameter_resolvers", "has_dunder_new_method", "read_init_of_subclasses"),
    ("jsonargparse.typing", "_LazyInitBaseClass", "lazy_instance"),
)

Class = TypeVar("Class")


def lazy_instance(class_type: type[Class], module: ModuleType, **kwargs: Any) -> Class:
    """``jsonargparse.lazy_instance(class_type, **kwargs)`` made for ``module``, the module whose default it is.

    A lazy instance is an option's default whose own options the command line can still set one by one
    (``--data.init_args.collection.prefetch true``) and which a resolved config shows as its class and options. The
    public function finds the module of its caller with ``inspect.stack()``, which reads the source of every frame on
    the stack; for a default made while the app imports, that walk of the whole import chain was a noticeable share of
    every command's start."""
    # jsonargparse.typing.lazy_instance's body (jsonargparse 4.53.0), with the module given.
    name = f"LazyInstance_{class_type.__name__}"
    lazy_class = getattr(module, name, None)
    if lazy_class is None:
        documented = {"__doc__": f"Class for lazy instances of {class_type}"}
        lazy_class = type(name, (_LazyInitBaseClass, class_type), documented)
        lazy_class.__module__ = module.__name__
        setattr(module, name, lazy_class)
    return lazy_class(class_type, kwargs)


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

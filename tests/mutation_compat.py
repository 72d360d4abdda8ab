"""A pytest plugin for scripts/mutation only (``-p tests.mutation_compat``): mutmut wraps every function it mutates
in a ``(*args, **kwargs)`` trampoline, and pyinfra binds a fact's arguments with ``inspect.getcallargs`` on its
``command`` method (pyinfra-testing checks them with ``inspect.getfullargspec``), neither of which looks through
wrappers. Bind against the wrapped function instead, so a mutated fact takes its arguments as the original does."""

from __future__ import annotations

import inspect
import types

import pyinfra.api.facts as facts
import pyinfra_testing.util as testing_util


def _unwrapped(func):
    bound_self = getattr(func, "__self__", None)
    plain = inspect.unwrap(getattr(func, "__func__", func))
    return types.MethodType(plain, bound_self) if bound_self is not None else plain


def _getcallargs(func, *args, **kwargs):
    return inspect.getcallargs(_unwrapped(func), *args, **kwargs)


def _getfullargspec(func):
    return inspect.getfullargspec(_unwrapped(func))


facts.getcallargs = testing_util.getcallargs = _getcallargs
testing_util.getfullargspec = _getfullargspec

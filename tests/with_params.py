"""A test helper: an object whose named methods get fixed params as their first argument."""
import functools


class WithParams:
    """`WithParams(verifier, params, "p_yes", "p_yes_ids").p_yes(...)` calls
    `verifier.p_yes(params, ...)`; every other attribute is the wrapped object's."""

    def __init__(self, obj, params, *methods):
        self._obj, self._params, self._methods = obj, params, set(methods)

    def __getattr__(self, name):
        attr = getattr(self._obj, name)
        return functools.partial(attr, self._params) if name in self._methods else attr

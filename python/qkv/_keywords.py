"""Unknown keyword arguments name the closest known one, as the CLI's options do."""

import functools
import inspect

from . import _qkv


def suggest_keywords(fn):
    """Wraps fn so that an unknown keyword argument raises TypeError with Python's own message and
    "(did you mean 'causal'?)" when a known one is close (the CLI's rule: qkv/suggest.h). Checked only
    after a TypeError, so a correct call costs nothing extra."""
    params = inspect.signature(fn).parameters.values()
    known = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError:
            unknown = [name for name in kwargs if name not in known]
            if not unknown:
                raise
            best = _qkv._closest_name(unknown[0], known)
            hint = f" (did you mean '{best}'?)" if best else f" (see help(qkv.{fn.__name__}))"
            raise TypeError(f"{fn.__name__}() got an unexpected keyword argument '{unknown[0]}'{hint}") from None
    return wrapper

"""PyTorch's layout and memory-format options, for the factory and copy functions that take them.

An engine tensor is a dense row-major array, so `strided`, `contiguous_format` and
`preserve_format` describe every tensor and change nothing; a sparse layout or a channels-last
memory format would change how a tensor is laid out, which the engine does not do: they are
refused by name rather than ignored.
"""
import functools
import inspect

__all__ = ["strided", "sparse_coo", "contiguous_format", "preserve_format", "channels_last", "channels_last_3d"]


class _Option:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"engine.{self.name}"

    def __reduce__(self):  # pickled (a DataLoader worker's arguments) as the module's own object
        return self.name


strided, sparse_coo = _Option("strided"), _Option("sparse_coo")
contiguous_format, preserve_format = _Option("contiguous_format"), _Option("preserve_format")
channels_last, channels_last_3d = _Option("channels_last"), _Option("channels_last_3d")
_DEFAULTS = {"out": None, "layout": None, "pin_memory": False, "memory_format": None}


def check_memory_format(fn, memory_format):
    if memory_format not in (None, contiguous_format, preserve_format):
        raise NotImplementedError(f"{fn}(): memory_format={memory_format!r} is not implemented (engine tensors are "
                                  "row-major arrays: contiguous_format or preserve_format)")


def _check(fn, key, value):
    if key == "out" and value is not None:
        raise TypeError(f"{fn}(): out= is not supported: functions return new tensors (docs/migrating.md)")
    if key == "layout" and value not in (None, strided):
        raise NotImplementedError(f"{fn}(): layout={value!r} is not implemented (engine tensors are strided)")
    if key == "memory_format":
        check_memory_format(fn, value)
    # pin_memory: CPU arrays need no pinning (as DataLoader's pin_memory, docs/migrating.md)


def factory_options(*accepted):
    """Let a factory take the PyTorch options in `accepted` (out, layout, pin_memory,
    memory_format) that its torch counterpart takes, refusing the values it cannot honour. Any
    other keyword stays a TypeError of the factory itself: a typo such as `dtpye=` must not pass."""
    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for key in accepted:
                if key in kwargs:
                    _check(fn.__name__, key, kwargs.pop(key))
            return fn(*args, **kwargs)

        sig = inspect.signature(fn)
        options = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=_DEFAULTS[k]) for k in accepted]
        wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *options])
        return wrapper

    return wrap

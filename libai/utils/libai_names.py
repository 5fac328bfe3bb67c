"""LiBai names this project does not implement: importing one is an ImportError that says so
(instead of Python's bare "cannot import name"), so a LiBai config or script fails with the reason.

A package lists its missing names and installs `missing_names_getattr` as its module
`__getattr__`; other unknown names stay an AttributeError."""

__all__ = ["missing_names_getattr"]


def missing_names_getattr(module_name, missing, fallback=None):
    """A module `__getattr__` for `module_name`: a name in `missing` ({name: note}) raises
    ImportError naming it and the note; any other name goes to `fallback(name)` when given, else
    raises AttributeError."""

    def __getattr__(name):
        if name in missing:
            raise ImportError(f"{module_name}.{name} (LiBai's) is not implemented in this project: {missing[name]}",
                              name=module_name)
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__

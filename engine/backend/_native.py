"""What the CPU backend's native libraries (MKL, oneDNN, the numba kernels) share: where a
wheel puts a shared library, and the environment switches that turn each one off."""
import glob
import os
import sys


def switched_off(env_var):
    """Whether `env_var` (ENGINE_MKL, ENGINE_JIT, ...) turns its library off: 0, false, no, off."""
    return os.environ.get(env_var, "1").strip().lower() in ("0", "false", "no", "off")


def library_candidates(env_var, pattern, fallbacks):
    """Where to look for a shared library a wheel installs: the path in `env_var` alone if set,
    else `<prefix>/lib/<pattern>` under this environment's prefixes (newest version first), then
    the bare names in `fallbacks` for the system's loader."""
    env = os.environ.get(env_var)
    if env:
        return [env]
    found = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, os.environ.get("CONDA_PREFIX") or "")):
        if prefix:
            found += sorted(glob.glob(os.path.join(prefix, "lib", pattern)), reverse=True)
    return found + list(fallbacks)

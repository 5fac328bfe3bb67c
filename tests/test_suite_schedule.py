"""tests/longest_first.py names tests that exist: a renamed test would silently lose
its early start (and the suite its balance between the two xdist workers)."""
import os
import re

from longest_first import LONGEST_FIRST

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_longest_first_names_existing_tests():
    for nodeid in LONGEST_FIRST:
        path, name = nodeid.split("::")
        with open(os.path.join(ROOT, path)) as f:
            assert re.search(rf"^def {re.escape(name)}\(", f.read(), re.M), nodeid

"""LiBai's `LazyConfig.to_py` text: a config as readable Python-like pseudo code.

    cfg.train.lr = 0.1
    cfg.model = libai.models.GPTModel(hidden_size=768, num_layers=12)

Nested plain dicts become dotted assignments (keys sorted); a LazyCall node becomes a call of its
target's import path with its arguments sorted by name; inside a call dicts and lists are literals.
LiBai runs `black` over that text; this module lays it out the way black does for these
expressions (88 columns, double quotes, a bracket that does not fit opened with one item per line
and a trailing comma, call arguments that fit on one indented line kept together), so black is
not needed. The text is for reading, not for executing: values without a literal form are their
repr().
"""
from collections import abc

__all__ = ["config_to_py"]

LINE_LENGTH = 88
INDENT = "    "


# ---------------------------------------------------------------------------------------------
# expression trees: ("atom", text) | ("call", name, [(kw, node)]) | ("dict", [(key, node)])
# | ("list", [node])
# ---------------------------------------------------------------------------------------------
def _quote(s):
    """A str literal with black's quote preference: double quotes unless that needs more escapes."""
    text = repr(s)
    if text[0] == '"':
        return text
    body = text[1:-1]
    new_body = body.replace("\\'", "'")
    escaped = ""
    i = 0
    while i < len(new_body):  # escape bare double quotes, keep existing escapes
        ch = new_body[i]
        if ch == "\\" and i + 1 < len(new_body):
            escaped += new_body[i:i + 2]
            i += 2
            continue
        escaped += '\\"' if ch == '"' else ch
        i += 1
    if escaped.count("\\") > body.count("\\"):
        return text
    return f'"{escaped}"'


def _atom(value):
    if isinstance(value, str):
        return ("atom", _quote(value))
    return ("atom", repr(value))


def _value_tree(value, target_to_string):
    """The tree of a value inside a call (dicts and lists are literals)."""
    if isinstance(value, abc.Mapping) and "_target_" in value:
        return _call_tree(value, target_to_string)
    if isinstance(value, abc.Mapping):
        return ("dict", [(_atom(k)[1], _value_tree(v, target_to_string)) for k, v in _sorted(value)])
    if isinstance(value, list):
        return ("list", [_value_tree(v, target_to_string) for v in value])
    return _atom(value)


def _call_tree(node, target_to_string):
    args = dict(node)
    target = args.pop("_target_")
    name = target if isinstance(target, str) else target_to_string(target)
    return ("call", name, [(str(k), _value_tree(v, target_to_string)) for k, v in _sorted(args)])


def _sorted(mapping):
    return sorted(mapping.items(), key=lambda kv: str(kv[0]))


# ---------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------
def _flat(tree):
    kind = tree[0]
    if kind == "atom":
        return tree[1]
    if kind == "call":
        return f"{tree[1]}(" + ", ".join(f"{k}={_flat(v)}" for k, v in tree[2]) + ")"
    if kind == "dict":
        return "{" + ", ".join(f"{k}: {_flat(v)}" for k, v in tree[1]) + "}"
    return "[" + ", ".join(_flat(v) for v in tree[1]) + "]"


def _parts(tree):
    """(opening text, [(item prefix, item tree)], closing text) of a bracketed tree."""
    kind = tree[0]
    if kind == "call":
        return f"{tree[1]}(", [(f"{k}=", v) for k, v in tree[2]], ")"
    if kind == "dict":
        return "{", [(f"{k}: ", v) for k, v in tree[1]], "}"
    return "[", [("", v) for v in tree[1]], "]"


def _lines(tree, indent, head, tail):
    """The lines of `head + tree + tail` at `indent`, split like black when too long."""
    one = f"{indent}{head}{_flat(tree)}{tail}"
    if len(one) <= LINE_LENGTH or tree[0] == "atom":
        return [one]
    opening, items, closing = _parts(tree)
    if not items:
        return [one]
    inner = indent + INDENT
    lines = [f"{indent}{head}{opening}"]
    if len(items) == 1:  # no delimiter to split at: the item alone on its line(s), no trailing comma
        prefix, item = items[0]
        lines += _lines(item, inner, prefix, "")
    else:
        together = inner + ", ".join(prefix + _flat(item) for prefix, item in items)
        if tree[0] == "call" and len(together) <= LINE_LENGTH:
            lines.append(together)  # black keeps call arguments on one line when they fit
        else:
            for prefix, item in items:
                lines += _lines(item, inner, prefix, ",")
    lines.append(f"{indent}{closing}{tail}")
    return lines


def _assignment(tree, head):
    """`head + tree` as a statement: black wraps the right-hand side in parentheses when that is
    the only way to fit it (an atom that fits alone on the next line; a bracket whose opening line
    `head + name(` is too long), else splits at the value's own brackets."""
    flat = _flat(tree)
    if len(head) + len(flat) <= LINE_LENGTH:
        return [head + flat]
    opening, items, _ = _parts(tree) if tree[0] != "atom" else ("", (), "")
    if not items:  # nothing to split inside: parentheses if the value then fits
        if len(INDENT) + len(flat) <= LINE_LENGTH:
            return [head + "(", INDENT + flat, ")"]
        return [head + flat]
    plain = _lines(tree, "", head, "")
    # a bracket whose opening line is too long: parentheses instead when every line then fits
    if len(plain[0]) > LINE_LENGTH:
        wrapped = [head + "("] + _lines(tree, INDENT, "", "") + [")"]
        if all(len(line) <= LINE_LENGTH for line in wrapped):
            return wrapped
    return plain


def _statements(node, prefix, target_to_string, out):
    if isinstance(node, abc.Mapping) and "_target_" in node:
        out += _assignment(_call_tree(node, target_to_string), prefix)
        return
    for key, value in _sorted(node):
        name = f"{prefix}{key}"
        if isinstance(value, abc.Mapping) and "_target_" not in value and value:
            _statements(value, name + ".", target_to_string, out)
        else:
            out += _assignment(_value_tree(value, target_to_string), f"{name} = ")


def config_to_py(container, prefix, target_to_string):
    """The to_py text of a resolved, to_container'ed config; `target_to_string(callable)` names
    a target by its import path."""
    out = []
    _statements(container, prefix, target_to_string, out)
    return "\n".join(out) + "\n" if out else ""

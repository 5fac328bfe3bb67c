"""What an SBP rule is, and the registry that maps an op class to its rule.

A `Rule` lists, for one mesh axis, the signatures an op can run under (`Signature(ins, outs)`:
an SBP per input and per output), translates shape-valued attributes to the shard
(`local_attrs`), may give logical output shapes outright (`out_shapes`), may pick another local
kernel for a signature (`kernel`) or compute the op from other global ops (`decompose`). The
default rule offers only "all broadcast", which is always valid: inputs are gathered and every
rank computes the whole result. A rule adds cheaper options; dispatch.py picks the one whose
boxing of the actual inputs moves the fewest bytes.

Each file of this package holds the rules of the ops of the file of the same name in
engine/ops, each registered by `sbp_rule` right where it is defined.
"""
from ..sbp import Signature, broadcast as B

__all__ = ["Rule", "sbp_rule", "rule_for"]


class Rule:
    # set by rules whose signatures are valid only for some numbers of parts (see `allows`)
    checks_parts = False

    def allows(self, sig, shapes, attrs, parts):
        """Whether `sig` is valid when input i's axes are cut into `parts[i]` = {axis: parts}
        (the product over every mesh axis that splits it so far). Only asked when
        `checks_parts` is set."""
        return True

    def signatures(self, shapes, attrs):
        """The candidate signatures for the logical input `shapes` (None for absent inputs);
        subclasses extend this list, whose first entry is the always-valid all-broadcast one."""
        present = [s is not None for s in shapes]
        n_out = self.n_outputs(attrs)
        return [Signature([B if p else None for p in present], [B] * n_out)]

    def local_attrs(self, attrs, shapes, in_nd, placement, coords):
        """The op's attributes for the shard at mesh `coords` (e.g. a target shape scaled down
        on a split axis) when the inputs are laid out as `in_nd`."""
        return attrs

    def out_shapes(self, shapes, attrs):
        """Logical output shapes when they follow from the inputs (saves the collective that
        otherwise gathers the shards' extents), else None."""
        return None

    def n_outputs(self, attrs):
        return 1

    def kernel(self, op_cls, chosen):
        """The Op whose forward/backward run on the shards under the chosen signatures (one per
        mesh axis); usually the op itself."""
        return op_cls

    def decompose(self, inputs, attrs):
        """Return the result computed with other global ops, or None to dispatch normally."""
        return None


DEFAULT = Rule()
_RULES = {}


def sbp_rule(*op_classes):
    """Register the SBP rule of `op_classes`. Above a Rule subclass (`@sbp_rule(LayerNorm)`) it
    registers an instance of the class; called on an instance
    (`sbp_rule(Add, Sub)(Pointwise(linear=True))`) it registers that configured rule."""

    def register(rule):
        instance = rule() if isinstance(rule, type) else rule
        for c in op_classes:
            if c in _RULES:
                raise ValueError(f"{c.__name__} already has the SBP rule {type(_RULES[c]).__name__}")
            _RULES[c] = instance
        return rule

    return register


def rule_for(op_cls):
    """The SBP rule of `op_cls` (the all-broadcast default when it has none)."""
    return _RULES.get(op_cls, DEFAULT)


def registered_ops():
    """Every op class with a rule of its own (for tests and coverage reports)."""
    return dict(_RULES)

"""`Linear`: a linear layer on global tensors, data-, column- or row-parallel (Megatron).

    parallel   weight [out, in]   bias        input x            output
    "data"     [B, B]             [B, B]      [S(0), B]          [S(0), B]
    "col"      [B, S(0)]          [B, S(0)]   [S(0), B]          [S(0), S(-1)]   (no communication)
    "row"      [B, S(1)]          [B, B]      [S(0), S(-1)]      [S(0), P] -> all-reduce -> [S(0), B]

(SBPs on the [dp, tp] mesh; they collapse to 1-D when only one of dp/tp is > 1 and to [B] in a
single process, see libai.utils.distributed.get_nd_sbp.) The engine's SBP rule for `linear`
picks the column/row-parallel signature from the parameter layouts; the row-parallel partial
sum is reduced *before* the bias is added, so the bias is added once.
"""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.utils import distributed as dist

from .utils import dropout, make_parameter, settle, to_placement

__all__ = ["Linear", "Linear1D"]

B = flow.sbp.broadcast
S = flow.sbp.split


class Linear(nn.Module):
    """y = x W^T + b with W [out_features, in_features].

    Args:
        parallel: "data" (replicated weight), "col" (weight split on out_features over the
            tensor-parallel ranks) or "row" (split on in_features).
        init_method: in-place initialiser of the weight (the bias starts at zero).
        output_dropout_prob: dropout on the output (after the bias).
        skip_bias_add: return `(output_without_bias, bias)` so that the caller can fuse the bias
            add with something else (LiBai's bias-dropout-add).
        layer_idx: which layer (pipeline stage) the parameters live on.
    """

    def __init__(self, in_features, out_features, bias=True, parallel="data",
                 init_method=nn.init.xavier_normal_, skip_bias_add=False, *, layer_idx=0,
                 output_dropout_prob=0.0, dtype=None):
        super().__init__()
        if parallel not in ("data", "col", "row"):
            raise ValueError(f"Linear: parallel must be 'data', 'col' or 'row', got {parallel!r}")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.parallel = parallel
        self.skip_bias_add = skip_bias_add
        self.output_dropout_prob = float(output_dropout_prob)
        self.layer_idx = layer_idx
        if parallel == "col":
            dist.check_tensor_parallel_divisible(out_features, "Linear(parallel='col'): out_features")
            w_sbp, b_sbp = [B, S(0)], [B, S(0)]
        elif parallel == "row":
            dist.check_tensor_parallel_divisible(in_features, "Linear(parallel='row'): in_features")
            w_sbp, b_sbp = [B, S(1)], [B, B]
        else:
            w_sbp, b_sbp = [B, B], [B, B]
        placement = dist.get_layer_placement(layer_idx)
        self.weight = make_parameter((self.out_features, self.in_features), init_method, placement,
                                     dist.get_nd_sbp(w_sbp), dtype)
        if bias:
            self.bias = make_parameter((self.out_features,), None, placement, dist.get_nd_sbp(b_sbp), dtype)
        else:
            self.bias = None

    def forward(self, x):
        x = to_placement(x, self.weight.placement)
        if self.parallel == "row" and dist.get_tensor_parallel_size() > 1:
            # [S(0), S(-1)] x [B, S(1)] -> [S(0), P]; reduce, then add the replicated bias once
            y = settle(F.linear(x, self.weight))
            bias = self.bias
        elif self.skip_bias_add:
            y, bias = F.linear(x, self.weight), self.bias
        else:
            y, bias = F.linear(x, self.weight, self.bias), None
        if self.skip_bias_add:
            return y, bias
        if bias is not None:
            y = y + bias
        return dropout(y, self.output_dropout_prob, self.training)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, parallel={self.parallel}")


Linear1D = Linear  # LiBai's name

"""The classifiers' losses, chosen by HuggingFace's `problem_type` (BERT's sequence classifier,
ViT, Swin), so that a folder fine-tuned with HF trains here with the loss it was trained with.

    "regression"                  mean squared error: [N] for one output, [N, C] for C outputs
    "single_label_classification" cross-entropy over C classes, integer labels [N]
    "multi_label_classification"  binary cross-entropy with logits, labels [N, C] of 0/1 (floats)
    None                          inferred as HF does: one output -> regression, integer labels ->
                                  single label, float labels -> multi-label; except that the image
                                  classifiers read float labels [N, C] as soft targets (Mixup's,
                                  each row a distribution), LiBai's convention, and take the
                                  soft-target cross-entropy.
"""
import engine as flow
import engine.nn as nn
import engine.nn.functional as F
from libai.layers.utils import to_placement

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


class SoftTargetCrossEntropy(nn.Module):
    """mean over samples of -sum_c target[c] * log_softmax(logits)[c] (Mixup's soft labels)."""

    def forward(self, logits, target):
        return -(target * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def check_problem_type(owner, problem_type):
    """ValueError naming `owner` unless `problem_type` is None or one of HF's three."""
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise ValueError(f"{owner}: problem_type={problem_type!r} is not one of {list(PROBLEM_TYPES)} (or None: "
                         "inferred from the labels, as HuggingFace does)")


def _same_shape(logits, labels, problem_type):
    if tuple(labels.shape) != tuple(logits.shape):
        raise ValueError(f"problem_type={problem_type!r}: labels of shape {list(labels.shape)} for logits of shape "
                         f"{list(logits.shape)}; this loss needs one label per logit")


def classification_loss(logits, labels, problem_type=None, soft_targets=False):
    """The loss of `logits` [N, C] against `labels` by `problem_type` (the module docstring);
    `soft_targets`: float labels [N, C] under problem_type None are Mixup's soft targets (the
    image classifiers) rather than HF's multi-label 0/1 targets (BERT)."""
    if logits.is_global:  # labels given as a local tensor: the whole batch, as every rank has it
        labels = to_placement(labels, logits.placement)
    num_labels = logits.shape[-1]
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif not labels.is_floating_point():
            problem_type = "single_label_classification"
        elif soft_targets and labels.ndim == 2:
            return SoftTargetCrossEntropy()(logits, labels.to(logits.dtype))
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.view(-1), labels.to(logits.dtype).view(-1))
        _same_shape(logits, labels, problem_type)
        return F.mse_loss(logits, labels.to(logits.dtype))
    if problem_type == "single_label_classification":
        if labels.is_floating_point():
            raise ValueError(f"problem_type='single_label_classification' takes integer class labels, got "
                             f"{labels.dtype} labels of shape {list(labels.shape)}")
        return F.cross_entropy(logits.view(-1, num_labels), labels.to(flow.int64).view(-1))
    _same_shape(logits, labels, problem_type)
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))

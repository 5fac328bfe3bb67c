"""Shared checks of the ViT and Swin HuggingFace parity tests: a perturbed HF model saved, and
our model loaded from its folder compared on logits or on the loss."""
import numpy as np
import torch

import engine as flow


def save_perturbed(model, path, seed):
    """`model` with every parameter moved off its initial value (non-zero biases and tables), saved."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(path)
    return model


def assert_logits_match(hf, ours_cls, path, image_size, atol=1e-5):
    ours = ours_cls.from_huggingface(str(path)).eval()
    x = np.random.default_rng(3).standard_normal((2, 3, *image_size)).astype(np.float32)
    got = ours(flow.tensor(x))["prediction_scores"].detach().numpy()
    want = hf.eval()(pixel_values=torch.from_numpy(x)).logits.detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def assert_loss_matches(hf, ours_cls, path, image_size, labels):
    """HF's loss for `labels` (by the folder's problem_type, or the one HF infers from them), and
    the classifier's weight gradient."""
    ours = ours_cls.from_huggingface(str(path)).train()
    x = np.random.default_rng(4).standard_normal((len(labels), 3, *image_size)).astype(np.float32)
    loss = ours(flow.tensor(x), flow.tensor(labels))["losses"]
    ref = hf.train()(pixel_values=torch.from_numpy(x), labels=torch.from_numpy(labels)).loss
    np.testing.assert_allclose(float(loss.detach().numpy()), float(ref), rtol=1e-5)
    loss.backward()
    ref.backward()
    np.testing.assert_allclose(ours.head.weight.grad.numpy(), hf.classifier.weight.grad.numpy(), rtol=1e-4,
                               atol=1e-6)


def assert_regression_loss_matches(hf, ours_cls, path, image_size):
    """num_labels == 1: HF's mean squared error against float labels."""
    assert_loss_matches(hf, ours_cls, path, image_size, np.array([0.5, -1.0, 2.0], np.float32))

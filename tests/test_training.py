"""End-to-end learning: a small MLP and a small CNN reach a low loss on synthetic data, and one
training step of each matches PyTorch exactly on shared weights."""
import numpy as np
import torch

import engine as flow


def _blobs(n=256, dim=8, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, dim)) * 3
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.standard_normal((n, dim))
    return x.astype(np.float32), y.astype(np.int64)


def _mlp(lib):
    nn = lib.nn
    return nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _cnn(lib):
    nn = lib.nn
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, 2),
    )


def _images(n=128, seed=0):
    """Class 0: horizontal stripes, class 1: vertical stripes, plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    base = (np.arange(8) % 2).astype(np.float32)
    imgs = np.where(y[:, None, None] == 0, base[None, :, None], base[None, None, :]) * np.ones((n, 8, 8))
    imgs = imgs + 0.3 * rng.standard_normal((n, 8, 8))
    return imgs[:, None].astype(np.float32), y.astype(np.int64)


def _copy_weights(fmodel, tmodel):
    fmodel.load_state_dict({k: flow.tensor(v.detach().numpy()) for k, v in tmodel.state_dict().items()})


def _train(lib, model, x, y, steps, lr):
    opt = lib.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = lib.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _learns_and_tracks_torch(what, make_model, data, steps, final_loss_below):
    """Train the same model (torch's initial weights) in both libraries with Adam(lr=1e-2): the
    first five losses match torch and the last one is below `final_loss_below`."""
    x, y = data
    torch.manual_seed(0)
    tm = make_model(torch)
    fm = make_model(flow)
    _copy_weights(fm, tm)
    lf = _train(flow, fm, flow.tensor(x), flow.tensor(y), steps, 1e-2)
    lt = _train(torch, tm, torch.tensor(x), torch.tensor(y), steps, 1e-2)
    np.testing.assert_allclose(lf[:5], lt[:5], rtol=1e-4)
    assert lf[-1] < final_loss_below, f"{what} did not learn: final loss {lf[-1]:.4f}"


def test_mlp_learns_and_tracks_torch():
    _learns_and_tracks_torch("MLP", _mlp, _blobs(), steps=60, final_loss_below=0.05)


def test_cnn_learns_and_tracks_torch():
    _learns_and_tracks_torch("CNN", _cnn, _images(), steps=40, final_loss_below=0.1)

"""torchvision as a test oracle next to the CPU-only torch.

PyPI's torchvision 0.28.0 wheel (the one that pins torch 2.13.0) is built against CUDA torch, so
its C++ ops (`torchvision._C`) do not load here. Its transforms are pure Python and do not need
them, but importing the package registers fake kernels for two of those ops and fails when they
do not exist. Defining the two op schemas first (never run: nothing here calls them) lets the
package import, and the transforms work as they do everywhere."""
import torch

try:
    import torchvision  # noqa: F401  (works where its ops load)
except RuntimeError:
    import sys

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _lib = torch.library.Library("torchvision", "FRAGMENT")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision  # noqa: F401

import torchvision.transforms as TV  # noqa: E402
import torchvision.transforms.functional as TVF  # noqa: E402

__all__ = ["TV", "TVF"]

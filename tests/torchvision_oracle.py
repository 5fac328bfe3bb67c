"""torchvision as an optional test oracle (`TV`, `TVF`; None when it cannot be imported).

It is not part of the test extra: PyPI's torchvision 0.28.0 (the release that pins torch 2.13.0)
is built against CUDA torch, and installed beside the CPU torch it breaks `transformers`' model
imports, which the HuggingFace parity tests need. Where it is installed anyway, its C++ ops do not
load; its transforms are pure Python and do not need them, but importing the package registers
fake kernels for two of those ops, so their schemas are defined first (never run). The
transform tests that need no torchvision hold values recorded from torchvision 0.28.0."""
import sys

import torch

TV = TVF = None
try:
    try:
        import torchvision  # noqa: F401
    except RuntimeError:  # its ops did not load
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        _lib = torch.library.Library("torchvision", "FRAGMENT")
        _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision  # noqa: F401
    import torchvision.transforms as TV  # noqa: F811
    import torchvision.transforms.functional as TVF  # noqa: F811
except ImportError:
    pass

__all__ = ["TV", "TVF"]

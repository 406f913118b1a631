"""Vision cases of :mod:`tools.cases.libs`: torchvision's and timm's classifiers, compiled as their users do
(``precompile.compile(model)``), called on a batch of images at two batch sizes.

torchvision and timm live in their own venv (``tools/install/vision.sh``): installing torchvision breaks
``import transformers`` beside it.  Only :func:`import_torchvision` imports torchvision, on first use.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tools.cases.base import Setup

IMAGE = 32  # image side of the vision cases, in pixels
CLASSES = 10

_LIBRARY: list[Any] = []  # keeps torchvision's operator library alive for the life of the process


def import_torchvision() -> Any:
    """``import torchvision`` where its C++ operators cannot load.

    The torchvision 0.28 wheel links libtorch_cuda, so its ``_C`` extension does not load beside the CPU build of
    torch; ``import torchvision`` then fails in its fake (meta) kernel registrations with "operator torchvision::nms
    does not exist".  Classifiers need none of those operators: defining the two schemas the registrations look up
    lets the import finish.  A call to ``torchvision.ops.nms`` would still fail (no kernel), which these cases never
    make.  Where the extension did load, the schemas exist already and nothing is defined.
    """
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        raise ImportError("torchvision is not installed here (tools/install/vision.sh makes a venv with it)")
    if not _LIBRARY:
        try:
            torch.ops.torchvision.nms  # noqa: B018 - present when torchvision's C++ extension loaded
        except (AttributeError, RuntimeError):
            lib = torch.library.Library("torchvision", "FRAGMENT")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _LIBRARY.append(lib)
    import torchvision

    return torchvision


def _classifier(make: Any, device: str) -> Setup:
    torch.manual_seed(0)
    model = make().to(device).eval()
    g = torch.Generator().manual_seed(1)
    images = [torch.randn(b, 3, IMAGE, IMAGE, generator=g).to(device) for b in (2, 3)]

    def run(fn):
        return {f"logits_{x.shape[0]}": fn(x).cpu() for x in images}

    return Setup(model, None, run, lambda fn, i: fn(images[i % 2]))


def _resnet18(device: str, **config: Any) -> Setup:
    tv = import_torchvision()
    return _classifier(lambda: tv.models.resnet18(**{"num_classes": CLASSES, **config}), device)


def _tv_vit(device: str, **config: Any) -> Setup:
    tv = import_torchvision()
    defaults = dict(image_size=IMAGE, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                    num_classes=CLASSES)
    return _classifier(lambda: tv.models.VisionTransformer(**{**defaults, **config}), device)


def _timm(name: str, defaults: dict[str, Any], device: str, **config: Any) -> Setup:
    import_torchvision()  # timm imports torchvision
    import timm

    return _classifier(lambda: timm.create_model(name, pretrained=False, **{**defaults, **config}), device)


#: ``{case name: (the package it needs, builder(device, **config) -> Setup)}``; :mod:`tools.cases.libs` lists them.
MAKERS: dict[str, tuple[str, Any]] = {
    "tv_resnet18": ("torchvision", _resnet18),
    "tv_vit": ("torchvision", _tv_vit),
    "timm_vit": ("timm", functools.partial(_timm, "vit_tiny_patch16_224", dict(
        img_size=IMAGE, patch_size=8, depth=2, embed_dim=32, num_heads=2, num_classes=CLASSES))),
    "timm_resnet": ("timm", functools.partial(_timm, "resnet18", {"num_classes": CLASSES})),
}

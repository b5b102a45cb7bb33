"""ResNet-50 and VGG16 match torchvision's parameter list (names, shapes, order) and run.

torchvision is not installed here, so the reference is written down: the published parameter
counts (torchvision's model cards: ResNet-50 25,557,032; VGG16 138,357,544), literal first/last
entries, and the full list re-derived from torchvision's construction rules. Counting uses the
meta device, so the 138 M-parameter VGG costs no memory there.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from commscope.spec.models import VisionConfig
from commscope.workload.vision import build_vision_model, resnet50, synthetic_images, vgg16

Shape = tuple[int, ...]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _params(model: nn.Module) -> list[tuple[str, Shape]]:
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def _meta(builder: Callable[..., nn.Module], **kwargs: int) -> nn.Module:
    with torch.device("meta"):
        return builder(**kwargs)


def _reference_resnet50(num_classes: int = 1000) -> list[tuple[str, Shape]]:
    """torchvision.models.resnet50's named_parameters(): stem, 4 stages of Bottlenecks
    (planes 64/128/256/512, blocks 3/4/6/3, expansion 4; the first block of each stage has a
    conv1x1+BN downsample), fc."""
    out: list[tuple[str, Shape]] = [("conv1.weight", (64, 3, 7, 7))]
    out += [("bn1.weight", (64,)), ("bn1.bias", (64,))]
    inplanes = 64
    for stage, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}."
            out += [(p + "conv1.weight", (planes, inplanes, 1, 1))]
            out += [(p + "bn1.weight", (planes,)), (p + "bn1.bias", (planes,))]
            out += [(p + "conv2.weight", (planes, planes, 3, 3))]
            out += [(p + "bn2.weight", (planes,)), (p + "bn2.bias", (planes,))]
            out += [(p + "conv3.weight", (planes * 4, planes, 1, 1))]
            out += [(p + "bn3.weight", (planes * 4,)), (p + "bn3.bias", (planes * 4,))]
            if b == 0:
                out += [(p + "downsample.0.weight", (planes * 4, inplanes, 1, 1))]
                out += [(p + "downsample.1.weight", (planes * 4,))]
                out += [(p + "downsample.1.bias", (planes * 4,))]
            inplanes = planes * 4
    return out + [("fc.weight", (num_classes, 2048)), ("fc.bias", (num_classes,))]


# torchvision's vgg16().named_parameters(), written out: conv layers sit at the "features"
# indices that config D's conv/ReLU/max-pool sequence gives them.
VGG16_REFERENCE: list[tuple[str, Shape]] = [
    ("features.0.weight", (64, 3, 3, 3)), ("features.0.bias", (64,)),
    ("features.2.weight", (64, 64, 3, 3)), ("features.2.bias", (64,)),
    ("features.5.weight", (128, 64, 3, 3)), ("features.5.bias", (128,)),
    ("features.7.weight", (128, 128, 3, 3)), ("features.7.bias", (128,)),
    ("features.10.weight", (256, 128, 3, 3)), ("features.10.bias", (256,)),
    ("features.12.weight", (256, 256, 3, 3)), ("features.12.bias", (256,)),
    ("features.14.weight", (256, 256, 3, 3)), ("features.14.bias", (256,)),
    ("features.17.weight", (512, 256, 3, 3)), ("features.17.bias", (512,)),
    ("features.19.weight", (512, 512, 3, 3)), ("features.19.bias", (512,)),
    ("features.21.weight", (512, 512, 3, 3)), ("features.21.bias", (512,)),
    ("features.24.weight", (512, 512, 3, 3)), ("features.24.bias", (512,)),
    ("features.26.weight", (512, 512, 3, 3)), ("features.26.bias", (512,)),
    ("features.28.weight", (512, 512, 3, 3)), ("features.28.bias", (512,)),
    ("classifier.0.weight", (4096, 25088)), ("classifier.0.bias", (4096,)),
    ("classifier.3.weight", (4096, 4096)), ("classifier.3.bias", (4096,)),
    ("classifier.6.weight", (1000, 4096)), ("classifier.6.bias", (1000,)),
]  # fmt: skip


def test_resnet50_matches_torchvision() -> None:
    params = _params(_meta(resnet50))
    assert sum(torch.Size(s).numel() for _, s in params) == 25_557_032
    assert len(params) == 161
    assert params[:10] == [
        ("conv1.weight", (64, 3, 7, 7)),
        ("bn1.weight", (64,)),
        ("bn1.bias", (64,)),
        ("layer1.0.conv1.weight", (64, 64, 1, 1)),
        ("layer1.0.bn1.weight", (64,)),
        ("layer1.0.bn1.bias", (64,)),
        ("layer1.0.conv2.weight", (64, 64, 3, 3)),
        ("layer1.0.bn2.weight", (64,)),
        ("layer1.0.bn2.bias", (64,)),
        ("layer1.0.conv3.weight", (256, 64, 1, 1)),
    ]
    assert params[12:16] == [
        ("layer1.0.downsample.0.weight", (256, 64, 1, 1)),
        ("layer1.0.downsample.1.weight", (256,)),
        ("layer1.0.downsample.1.bias", (256,)),
        ("layer1.1.conv1.weight", (64, 256, 1, 1)),
    ]
    assert params[-5:] == [
        ("layer4.2.conv3.weight", (2048, 512, 1, 1)),
        ("layer4.2.bn3.weight", (2048,)),
        ("layer4.2.bn3.bias", (2048,)),
        ("fc.weight", (1000, 2048)),
        ("fc.bias", (1000,)),
    ]
    assert params == _reference_resnet50()
    # v1.5: the stride-2 of a stage's first block is on the 3x3 conv, also in its downsample.
    model = _meta(resnet50)
    assert model.layer2[0].conv1.stride == (1, 1)
    assert model.layer2[0].conv2.stride == (2, 2)
    assert model.layer2[0].downsample[0].stride == (2, 2)
    # 53 BatchNorms x (running_mean, running_var, num_batches_tracked); state_dict has 320 keys.
    assert len(list(model.buffers())) == 159
    assert len(model.state_dict()) == 320
    assert _params(_meta(resnet50, num_classes=10)) == _reference_resnet50(10)


def test_vgg16_matches_torchvision() -> None:
    params = _params(_meta(vgg16))
    assert sum(torch.Size(s).numel() for _, s in params) == 138_357_544
    assert len(params) == 32
    assert params == VGG16_REFERENCE
    model = _meta(vgg16)
    assert isinstance(model.avgpool, nn.AdaptiveAvgPool2d) and model.avgpool.output_size == (7, 7)
    kinds = [type(m).__name__ for m in model.classifier]
    assert kinds == ["Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout", "Linear"]
    assert len(model.features) == 31  # 13 conv + 13 ReLU + 5 max-pool
    assert _params(_meta(vgg16, num_classes=10))[-2:] == [
        ("classifier.6.weight", (10, 4096)),
        ("classifier.6.bias", (10,)),
    ]


def test_resnet50_forward_backward_on_a_small_image() -> None:
    torch.manual_seed(0)
    model = resnet50()
    cfg = VisionConfig(arch="resnet50", image=64, batch=2)
    x, y = synthetic_images(cfg, cfg.batch, seed=0)
    out = model(x)
    assert out.shape == (2, 1000)
    torch.nn.functional.cross_entropy(out, y).backward()
    # Every parameter takes part (DDP without find_unused_parameters relies on it).
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        assert model(x[:1]).shape == (1, 1000)


def test_vgg16_forward_on_a_small_image() -> None:
    torch.manual_seed(0)
    model = vgg16(num_classes=10).eval()
    # 32x32 reaches 1x1 after five max-pools; adaptive pooling repeats it to 7x7.
    x, _ = synthetic_images(VisionConfig(arch="vgg16", image=32, num_classes=10), 2, seed=0)
    with torch.no_grad():
        out = model(x)
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()


def test_synthetic_images_and_builder() -> None:
    cfg = VisionConfig(arch="resnet50", image=32, batch=3, num_classes=7)
    x, y = synthetic_images(cfg, 3, seed=5)
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (3,) and y.dtype == torch.int64
    assert int(y.min()) >= 0 and int(y.max()) < 7
    x2, y2 = synthetic_images(cfg, 3, seed=5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, synthetic_images(cfg, 3, seed=6)[0])
    with torch.device("meta"):
        assert _params(build_vision_model(cfg))[-1] == ("fc.bias", (7,))
        assert _params(build_vision_model(VisionConfig(arch="vgg16")))[-1] == (
            "classifier.6.bias",
            (1000,),
        )
    with pytest.raises(ValueError, match="unknown"):
        build_vision_model(VisionConfig(arch="alexnet"))

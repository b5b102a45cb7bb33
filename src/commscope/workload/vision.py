"""ResNet-50 and VGG16, written here so no hub download or torchvision install is needed.

Both reproduce torchvision's reference definitions parameter for parameter: the same module names,
tensor shapes and registration order. That matters for communication traces, not for accuracy:
DDP fills its gradient buckets in reverse registration order and FSDP shards per module, so the
size and order of the collectives only match a torchvision run if the parameter list does.
The weight initialisation follows torchvision's as well (Kaiming-normal convolutions, unit/zero
BatchNorm, N(0, 0.01) VGG classifier).
"""

from __future__ import annotations

import torch
from torch import nn

from commscope.spec.models import VISION_ARCHS, VisionConfig


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: the stride sits on the 3x3 convolution."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        # Registration order conv1, bn1, conv2, bn2, conv3, bn3, relu, downsample as in torchvision.
        self.conv1 = _conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` restricted to Bottleneck blocks (groups=1, no dilation)."""

    def __init__(self, layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                _conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                nn.BatchNorm2d(planes * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# torchvision's configuration "D": channel counts, "M" = 2x2 max-pool.
_VGG16_CFG: list[int | str] = [
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
]  # fmt: skip


class VGG(nn.Module):
    """torchvision's ``VGG`` without batch norm: ``features``, ``avgpool``, ``classifier``."""

    def __init__(self, features: nn.Sequential, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = features
        # Adaptive pooling to 7x7 lets small test images reach the fixed 25088-wide classifier.
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(True),
            nn.Dropout(p=0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(True),
            nn.Dropout(p=0.5),
            nn.Linear(4096, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.classifier(x)


def _vgg_features(cfg: list[int | str]) -> nn.Sequential:
    layers: list[nn.Module] = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            assert isinstance(v, int)
            layers += [nn.Conv2d(in_channels, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


def resnet50(num_classes: int = 1000) -> nn.Module:
    """ResNet-50 (v1.5) with torchvision's parameter names, shapes and order (25,557,032 at 1000
    classes, 161 parameter tensors)."""
    return ResNet([3, 4, 6, 3], num_classes=num_classes)


def vgg16(num_classes: int = 1000) -> nn.Module:
    """VGG16 (configuration D, no batch norm) with torchvision's parameter names, shapes and order
    (138,357,544 at 1000 classes, 32 parameter tensors)."""
    return VGG(_vgg_features(_VGG16_CFG), num_classes=num_classes)


def build_vision_model(cfg: VisionConfig) -> nn.Module:
    """The model named by ``cfg.arch``."""
    builders = {"resnet50": resnet50, "vgg16": vgg16}
    if cfg.arch not in builders:
        raise ValueError(f"vision arch {cfg.arch!r} unknown; choose one of {list(VISION_ARCHS)}")
    return builders[cfg.arch](num_classes=cfg.num_classes)


def synthetic_images(cfg: VisionConfig, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(batch, 3, image, image)`` float images and int64 labels, reproducible from
    ``seed``. Communication volume does not depend on pixel values, so noise is enough."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, cfg.image, cfg.image, generator=gen)
    labels = torch.randint(0, cfg.num_classes, (batch,), generator=gen)
    return images, labels

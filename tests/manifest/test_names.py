"""Names read from an artifact (precompile.manifest.names), at their edges (a second probe of issue 30): a name
with a trailing newline (a ``$`` in a pattern matches before one) and identifiers outside ASCII (Python's
compiler folds them to NFKC, so two different stored names can become one) are refused like any other unsafe name.
"""

from __future__ import annotations

import pytest

from precompile.manifest import names
from precompile.errors import UnsafePathError


@pytest.mark.parametrize("check, good", [
    (names.plain_name, "w"), (names.binary_name, "c/x.so"), (names.relative_path, "a/b"),
    (names.module_name, "torch.ops"), (names.kernel_name, "triton_poi_fused_0")])
def test_a_name_with_a_trailing_newline_is_refused(check, good):
    assert check(good, "field") == good
    for bad in (good + "\n", good + "\n\n", "\n" + good):
        with pytest.raises(UnsafePathError, match="field"):
            check(bad, "field")


def test_a_kernel_name_outside_ascii_is_refused():
    assert "\uff4b".isidentifier()  # a fullwidth k: an identifier, which Python's compiler reads as k
    for bad in ("\uff4b", "k\u00e9", "\u212a"):
        with pytest.raises(UnsafePathError, match="ASCII"):
            names.kernel_name(bad, "kernels[0].name")

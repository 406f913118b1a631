"""A stored function's record checked, in the building process, for what a fresh process needs to install it.

``CompilePackage.install`` in a fresh process unpickles each frame's guard state and rebuilds its guard tree from
it; a value the pickle could not hold (torch's ``_Missing`` placeholder) fails there with ``AttributeError``, and a
global the building process named by an object's ``id()`` does not exist there at all, so every call would be
traced again.  :func:`check_installable` runs the same rebuild on the bytes about to be stored, before they are, so
a record a worker could not use is never written: the function is stored as refused instead, with this reason
(:mod:`precompile.function.compiled`).
"""

from __future__ import annotations

import re
import sys
from typing import Any

from precompile.inductor.dynamo.pkg import restore

#: A global Dynamo named by an object's ``id()`` in the building process (``install_global_by_id``,
#: ``{prefix}_{id}_c{compile id}``): absent from every other process.
_BY_ID = re.compile(r"_\d{6,}_c\d+$")
_GLOBAL = re.compile(r"G\['([^']*)'\]")


def check_installable(data: bytes) -> None:
    """Rebuild every guard tree of the record :func:`precompile.inductor.dynamo.pkg.dump` wrote, from its
    unpickled state, as ``CompilePackage.install`` does; and check that no guard or stored bytecode reads a global
    named by a process-local ``id()``.  Frames left out of the record are skipped (they are traced at run time).

    Raises:
        RuntimeError: naming the frame and why (``AttributeError: '_Missing' object has no attribute ...`` for a
            value the pickle left out; the globals named by ids).
    """
    from torch._dynamo.output_graph import get_builtins_dict
    from torch._dynamo.package import SerializedCode, load_guard_manager, load_guards_state

    record = restore(data)
    for entry in record.codes:
        if entry.bypassed:
            continue
        where = f"frame {entry.python_module}:{','.join(entry.function_names) or '<main>'}"
        code = SerializedCode.to_code_object(entry.python_code)
        scope = sys.modules[entry.python_module].__dict__
        for guarded in entry.guarded_codes:
            try:
                by_id = _named_by_id(SerializedCode.to_code_object(guarded.dynamo_code).co_names)
                state = load_guards_state(guarded.guards_state)
                by_id += _named_by_id(m for g in state.output_graph.guards for m in _GLOBAL.findall(str(g.name)))
                if by_id:
                    raise RuntimeError(f"it reads globals named by object ids of the building process: {by_id[:3]}")
                builtins = state.output_graph.name_of_builtins_dict_key_in_fglobals
                if builtins and builtins not in scope:
                    scope[builtins] = get_builtins_dict(scope)
                load_guard_manager(state, code, scope)
            except Exception as err:  # noqa: BLE001 - any failure here is one a fresh process would meet
                raise RuntimeError(f"{where} does not install: {type(err).__name__}: {err}") from err


def _named_by_id(names: Any) -> list[str]:
    return sorted({n for n in names if _BY_ID.search(n)})

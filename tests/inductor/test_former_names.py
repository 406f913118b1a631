"""Artifacts stored before precompile.inductor was split into wings (build/, load/, dynamo/) still load: the names
they carry of modules that moved (an extern kernel's stand-in in a fast plan, the guard-state functions in a
function artifact's pickles) find those modules where they are now."""

from __future__ import annotations

import json

from conftest import run_python

from precompile.inductor.load import externs, runtime

#: In a fresh process, as a worker installing a stored function: import what installing imports, then unpickle
#: what frame_state's pickler writes (a guarded object as ``named_guards.resolve(path)``, a closure cell as
#: ``frame_state.make_cell(value)``) and a guard's builder, each named by its module's old name (protocol 2 names a
#: global as ``c<module>\n<name>\n``).
UNPICKLE_FORMER_NAMES = r"""
import json, math, pickle
from precompile.inductor.dynamo import pkg  # what installing a stored record imports first
from precompile.inductor.dynamo import frame_state, named_guards

class Stored:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args
    def __reduce__(self):
        return self.fn, self.args

new = pickle.dumps([Stored(named_guards.resolve, (("module", "math"),)), Stored(frame_state.make_cell, 5),
                    named_guards.named_id_match], protocol=2)
old = new.replace(b"precompile.inductor.dynamo.", b"precompile.inductor.")
assert b"c" + b"precompile.inductor.frame_state\n" in old and b"c" + b"precompile.inductor.named_guards\n" in old
module, cell, builder = pickle.loads(old)
print(json.dumps({"module": module is math, "cell": cell.cell_contents,
                  "builder": builder is named_guards.named_id_match}))
"""


def test_a_stand_in_named_by_its_former_module_resolves():
    assert runtime.resolve("precompile.inductor.externs:bias_addmm") is externs.bias_addmm
    assert runtime.resolve("precompile.inductor.load.externs:bias_addmm") is externs.bias_addmm


def test_a_guard_state_naming_the_former_modules_unpickles_in_a_fresh_process():
    report = json.loads(run_python(UNPICKLE_FORMER_NAMES).splitlines()[-1])
    assert report == {"module": True, "cell": 5, "builder": True}

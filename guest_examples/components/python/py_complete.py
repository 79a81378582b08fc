"""py_complete: ``ALIAS PROMPT [OPTIONS_JSON]``, a wasi:nn component written in Python.

Built with componentize-py (not committed: about 18 MB)::

    mkdir -p build/wit && cp -r ../wit/deps build/wit/ && cp world.wit build/wit/
    componentize-py -d build/wit -w py-command componentize py_complete -o py_complete.wasm

It sends the prompt as an unnamed-style U8 tensor ``input`` and, when given, Hayride's ``options``
JSON, so it answers with the single tensor ``Output``; without options it prints ``output`` and
``metadata``.  A wasi:nn error is raised as ``Err(error)``: it prints ``CODE: MESSAGE`` and exits 1.
"""

import sys

from wit_world import exports
from wit_world.imports import graph, tensor
from componentize_py_types import Err


def u8(data: bytes) -> tensor.Tensor:
    return tensor.Tensor([len(data)], tensor.TensorType.U8, data)


class Run(exports.Run):
    def run(self) -> None:
        alias, prompt = sys.argv[1], sys.argv[2].encode()
        inputs = [("input", u8(prompt))]
        if len(sys.argv) > 3:
            inputs.append(("options", u8(sys.argv[3].encode())))
        try:
            context = graph.load_by_name(alias).init_execution_context()
            outputs = context.compute(inputs)
        except Err as err:
            print(f"{err.value.code().name}: {err.value.data()}", file=sys.stderr)
            raise SystemExit(1) from None
        for name, out in outputs:
            print(f"{name}: {out.data().decode()}")

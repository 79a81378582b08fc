"""py_set_input: ``ALIAS PROMPT [CONFIG_JSON]``, a wasi:nn 0.2.0-rc-2024-08-19 component written in Python.

Built with componentize-py (not committed: about 18 MB)::

    mkdir -p build/wit && cp -r ../wit/deps build/wit/ && cp world.wit build/wit/
    componentize-py -d build/wit -w py-command-2024-08-19 componentize py_set_input -o py_set_input.wasm

That version's execution context takes its inputs one by one (``set-input``), computes (``compute()``)
and hands out each output by name (``get-output``): it sets the prompt as ``prompt`` and the config
JSON, when given, as ``metadata``, and prints the tensor ``output`` (what ``nn_complete.wasm`` prints
on stdout).  A wasi:nn error is raised as ``Err(error)``: it prints ``CODE: MESSAGE`` and exits 1.
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
        try:
            context = graph.load_by_name(alias).init_execution_context()
            context.set_input("prompt", u8(prompt))
            if len(sys.argv) > 3:
                context.set_input("metadata", u8(sys.argv[3].encode()))
            context.compute()
            output = context.get_output("output").data()
        except Err as err:
            print(f"{err.value.code().name}: {err.value.data()}", file=sys.stderr)
            raise SystemExit(1) from None
        print(output.decode())

"""An editable install (``pip install -e .``) runs the checkout's files: the package is found by an
import hook, not through ``sys.path``, so nothing may rely on the directory above ``wasinn_host`` being
on ``sys.path``.  The gRPC protocol buffers used to (grpcio-tools finds a ``.proto`` through
``sys.path``), and every ``wasinn`` run from an editable install failed with ``No module named
'wasinn_host.rpc.protos.wasi_ephemeral_nn_pb2'``.

The test recreates exactly that condition in a child process: a copy of the package, loaded through an
import spec (as setuptools' editable finder does), with every ``sys.path`` entry that holds a
``wasinn_host`` seen through a view without it (in CI the regular install sits in site-packages and
would hide the bug; its dependencies beside it stay importable)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "wasinn_host"

PROBE = """
import importlib.util, pathlib, sys
source, overlay = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
# every sys.path entry holding a wasinn_host (site-packages in CI) is replaced by a view of it without
# the package, so the copy below is the only one and its parent directory is not on sys.path
paths = []
for index, entry in enumerate(sys.path):
    base = pathlib.Path(entry or ".")
    if (base / "wasinn_host").exists():
        view = overlay / str(index)
        view.mkdir(parents=True)
        for item in base.iterdir():
            if not item.name.startswith("wasinn_host"):
                (view / item.name).symlink_to(item)
        entry = str(view)
    paths.append(entry)
sys.path[:] = paths
sys.path_importer_cache.clear()
spec = importlib.util.spec_from_file_location(
    "wasinn_host", source / "wasinn_host" / "__init__.py", submodule_search_locations=[str(source / "wasinn_host")]
)
module = importlib.util.module_from_spec(spec)
sys.modules["wasinn_host"] = module
spec.loader.exec_module(module)
from wasinn_host.rpc import messages
assert pathlib.Path(messages.__file__).is_relative_to(source)
assert str(source) not in sys.path, "the compilation leaves sys.path as it found it"
print(messages.nn.GetOutputRequest.DESCRIPTOR.fields_by_name["output_max_size"].number)
print(sorted(messages.host.DESCRIPTOR.services_by_name["Host"].methods_by_name))
"""


def test_protocol_buffers_compile_where_the_package_is_not_on_sys_path(tmp_path: pathlib.Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "src" / "wasinn_host", ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "src"), str(tmp_path / "views")],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "3"
    assert "ComputePieces" in lines[1] and "ComputeSingleOutput" in lines[1]

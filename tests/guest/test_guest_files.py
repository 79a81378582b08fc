"""Guest paths resolved through preopened directories: the only files an ``image`` key may name."""

from __future__ import annotations

import pathlib

import pytest

from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.guest.files import read_guest_file, resolve_guest_path

pytestmark = pytest.mark.fast


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    for name in ("a/x.png", "a/b/y.png", "c/z.png", "outside.png"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    (tmp_path / "a" / "up.png").symlink_to(tmp_path / "outside.png")
    (tmp_path / "a" / "inner.png").symlink_to(tmp_path / "a" / "b" / "y.png")
    return tmp_path


def test_longest_guest_prefix_wins(tree: pathlib.Path) -> None:
    dirs = [(str(tree / "a"), "/data"), (str(tree / "c"), "/data/b")]
    assert resolve_guest_path("/data/x.png", dirs) == tree / "a" / "x.png"
    assert resolve_guest_path("/data/b/z.png", dirs) == tree / "c" / "z.png", "the nested mapping, not a/b"
    assert resolve_guest_path("/data/./b/../x.png", dirs) == tree / "a" / "x.png"
    assert resolve_guest_path("/data/inner.png", dirs) == tree / "a" / "b" / "y.png", "a link inside is fine"


def test_relative_paths_are_relative_to_the_guests_dot(tree: pathlib.Path) -> None:
    assert resolve_guest_path("x.png", [(str(tree / "a"), ".")]) == tree / "a" / "x.png"
    assert resolve_guest_path("./b/y.png", [(str(tree / "a"), ".")]) == tree / "a" / "b" / "y.png"
    with pytest.raises(WasiNNError):  # no '.' mapping: a relative path names nothing
        resolve_guest_path("x.png", [(str(tree / "a"), "/data")])


@pytest.mark.parametrize(
    "path", ["/data/../outside.png", "/data/up.png", "../outside.png", "/datax/x.png", "/etc/passwd", "/"]
)
def test_escapes_are_refused(path: str, tree: pathlib.Path) -> None:
    dirs = [(str(tree / "a"), "/data"), (str(tree / "a"), ".")]
    with pytest.raises(WasiNNError) as err:
        resolve_guest_path(path, dirs)
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT and "preopened" in err.value.message


def test_reads_are_capped(tree: pathlib.Path) -> None:
    dirs = [(str(tree / "a"), "/data")]
    assert read_guest_file("/data/x.png", dirs, limit=100) == b"a/x.png"
    with pytest.raises(WasiNNError, match="more than the limit of 3 bytes"):
        read_guest_file("/data/x.png", dirs, limit=3)
    with pytest.raises(WasiNNError, match="cannot read it"):
        read_guest_file("/data/missing.png", dirs, limit=100)

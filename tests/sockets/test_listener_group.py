"""ListenerGroup on its own: the first bind of an address binds, the same bind by a sibling shares that
socket, a second bind of the address by one instance is its own (and fails as the kernel says), and the
address is free once every instance has let go."""

from __future__ import annotations

import errno
import socket

import pytest

from wasinn_host.sockets.shared import ListenerGroup, SharedBinds

pytestmark = pytest.mark.fast


def bind_via(binds: SharedBinds, address: tuple[str, int]) -> tuple[socket.socket, object]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do (connections in TIME_WAIT)
    sibling, release = binds.bind(address, sock, lambda: sock.bind(address))
    if sibling is not None:
        sock.close()
        sock = sibling
    return sock, release


def test_siblings_share_one_bound_socket_and_free_it_together() -> None:
    group = ListenerGroup()
    first, second = SharedBinds(group), SharedBinds(group)
    a, release_a = bind_via(first, ("127.0.0.1", 0))
    a.listen(8)
    port = a.getsockname()[1]
    b, release_b = bind_via(second, ("127.0.0.1", 0))  # port 0 too: the first instance's port
    assert b.getsockname() == ("127.0.0.1", port)
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = b.accept()  # one queue: the sibling accepts what came to the shared socket
    conn.close()
    client.close()
    outsider = socket.socket()
    with pytest.raises(OSError) as refused:
        outsider.bind(("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    a.close()
    release_a()  # type: ignore[operator]
    assert len(group) == 1  # the sibling still listens
    b.close()
    release_b()  # type: ignore[operator]
    assert len(group) == 0
    outsider.close()
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    again.bind(("127.0.0.1", port))  # free again
    again.close()


def test_a_second_bind_of_an_address_by_one_instance_is_its_own() -> None:
    group = ListenerGroup()
    binds = SharedBinds(group)
    a, _ = bind_via(binds, ("127.0.0.1", 0))
    a.listen(8)
    port = a.getsockname()[1]
    with pytest.raises(OSError) as refused:
        bind_via(binds, ("127.0.0.1", port))
    assert refused.value.errno == errno.EADDRINUSE
    assert len(group) == 1
    a.close()

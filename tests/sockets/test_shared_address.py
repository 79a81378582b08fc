"""The instances of one run share a server guest's address: chat_server.wasm (LlamaEdge's shape, one
request at a time) run N times on one port answers N clients at once, their computes batched on one
model, while anything outside the run (a second ``wasinn run``) still gets ADDRINUSE."""

from __future__ import annotations

import http.client
import pathlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from wasinn_host import GuestError, ModelRegistry, RunOptions, WasiNN
from wasinn_host.core.scheduling.scheduler import ModelWorker
from wasinn_host.sockets import ListenerGroup
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

from .probe import AGAIN, FD, Probe, fd_sub, probe_port

NONBLOCK = 4  # WASI's FDFLAGS_NONBLOCK
SERVER = GUESTS / "chat_server.wasm"
WAIT = 60.0  # seconds: the longest any wait in these tests may take
PROMPTS = ("abc", "hello", "u", "xy", "mnop", "b")
ADDRINUSE_LINE = "socket error: sock_bind returned 3"  # WASI's ADDRINUSE


def chat(port: int, prompt: str) -> tuple[int, bytes]:
    """One chat on a new connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request("POST", "/v1/chat/completions", body=prompt.encode())
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def quit_one(port: int) -> None:
    """POST /quit: one instance answers it and ends."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    conn.request("POST", "/quit")
    assert conn.getresponse().read() == b"bye\n"
    conn.close()


def wait_until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {WAIT:g}s for {what}"
        time.sleep(0.01)


def listening_port(text: str) -> int:
    first = text.splitlines()[0]
    assert first.startswith("listening on 127.0.0.1:")
    return int(first.rsplit(":", 1)[1])


def port_is_free(port: int) -> bool:
    """Whether nothing listens on ``port`` (a listener may bind it: connections in TIME_WAIT do not count)."""
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


@pytest.fixture
def own_registry(model_dir: pathlib.Path) -> Iterator[ModelRegistry]:
    """A registry of this test's own: its one model's worker is this test's alone."""
    registry = ModelRegistry([f"succ:GGML:AUTO:{model_dir / 'successor.gguf'}"])
    yield registry
    registry.close()


def test_instances_share_one_address_and_their_computes_are_batched(
    own_registry: ModelRegistry, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four Stores of chat_server.wasm in one ListenerGroup (as ``--instances 4`` runs them) bind port 0 and
    listen on the same port.  With the model's worker held before it admits anything, four clients, each
    sent once the one before is waiting in the worker, are taken by four different instances (an instance
    waiting in compute accepts nothing): four computes wait at once, so every instance is serving, and
    once let go they are decoded together (4 sequences at once) and answered right.  Meanwhile a Store
    outside the group binding that port gets ADDRINUSE; once every instance has quit the port is free."""
    nn = WasiNN(registry=own_registry)
    group = ListenerGroup()
    outs = [tmp_path / f"server{i}.out" for i in range(4)]
    errs = [tmp_path / f"server{i}.err" for i in range(4)]
    results: dict[int, object] = {}

    def serve(index: int) -> None:
        options = RunOptions(stdout=str(outs[index]), stderr=str(errs[index]), listeners=group)
        try:
            results[index] = nn.run(SERVER, ["succ", "127.0.0.1", "0"], options)
        except GuestError as exc:
            results[index] = str(exc)

    threads = [threading.Thread(target=serve, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: all(out.exists() and out.read_text().endswith("\n") for out in outs), "four listeners")
        ports = {listening_port(out.read_text()) for out in outs}
        assert len(ports) == 1, ports  # port 0 bound once: the kernel's choice, for all four
        port = ports.pop()
        assert len(group) == 1

        assert chat(port, "abc") == (200, (successor_text("abc") + "</s>").encode())  # loads the model
        (model,) = own_registry.loaded()
        worker: ModelWorker = model.worker
        held = threading.Event()
        admit = worker._admit

        def held_admit() -> None:
            held.wait()
            admit()

        monkeypatch.setattr(worker, "_admit", held_admit)
        answers: dict[str, tuple[int, bytes]] = {}
        clients = []
        for n, prompt in enumerate(PROMPTS[:4], start=1):
            client = threading.Thread(target=lambda p=prompt: answers.__setitem__(p, chat(port, p)), daemon=True)
            client.start()
            clients.append(client)
            wait_until(lambda n=n: worker.queued == n, f"{n} computes waiting in the worker")

        outsider = tmp_path / "outsider.err"
        code = nn.run(SERVER, ["succ", "127.0.0.1", str(port)], RunOptions(stderr=str(outsider)))
        assert (code, outsider.read_text()) == (1, ADDRINUSE_LINE + "\n")

        decodes, sequences = worker.decode_calls, worker.sequences_decoded
        held.set()
        for client in clients:
            client.join(WAIT)
        assert answers == {p: (200, (successor_text(p) + "</s>").encode()) for p in PROMPTS[:4]}
        assert worker.sequences_high_water == 4
        assert worker.sequences_decoded - sequences > worker.decode_calls - decodes  # steps of several sequences

        for _ in range(4):
            quit_one(port)
        for thread in threads:
            thread.join(WAIT)
        assert results == {0: 0, 1: 0, 2: 0, 3: 0}
        chats = sorted(int(out.read_text().splitlines()[-1].split()[2]) for out in outs)
        assert chats == [1, 1, 1, 2]  # each instance served one of the held computes; one the first chat too
        assert len(group) == 0
        assert port_is_free(port)
    finally:
        monkeypatch.undo()
        nn.cancel_all()
        for thread in threads:
            thread.join(WAIT)


def test_wasinn_run_instances_answer_concurrent_chats_on_one_port(preload_specs: list[str]) -> None:
    """``wasinn run --instances 3`` of chat_server.wasm on port 0: three "listening" lines with one port,
    six concurrent chats all answered right; a second ``wasinn run`` on that port fails with the guest's
    ADDRINUSE line; three /quit end the three instances (exit 0), which served the six chats between them."""
    guest = [str(SERVER), "succ", "127.0.0.1"]
    command = [sys.executable, "-m", "wasinn_host", "run", "--nn-preload", preload_specs[0]]
    proc = subprocess.Popen(
        [*command, "--instances", "3", *guest, "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert len(set(lines)) == 1 and lines[0].startswith("listening on 127.0.0.1:"), lines
        port = listening_port(lines[0])

        answers: dict[str, tuple[int, bytes]] = {}
        clients = [
            threading.Thread(target=lambda p=p: answers.__setitem__(p, chat(port, p)), daemon=True) for p in PROMPTS
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(WAIT)
        assert answers == {p: (200, (successor_text(p) + "</s>").encode()) for p in PROMPTS}

        second = subprocess.run([*command, *guest, str(port)], capture_output=True, text=True, timeout=WAIT)
        assert (second.returncode, second.stderr) == (1, ADDRINUSE_LINE + "\n")

        for _ in range(3):
            quit_one(port)
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    byes = [line for line in out.splitlines() if line.startswith("bye after ")]
    assert len(byes) == 3 and sum(int(line.split()[2]) for line in byes) == len(PROMPTS), out
    assert port_is_free(port)


def test_a_shared_listener_gives_an_instance_one_connection_per_poll(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    """Two probes in one ListenerGroup bind port 0 and listen on one port; with connections waiting, the first
    probe's non-blocking accept takes one, its next accept answers AGAIN (the other connection is left to
    the siblings); its next poll_oneoff, while its new connection has a request, reports that request but not
    the listener; the poll after reports both and it may accept again; the sibling accepts from the same queue."""
    group = ListenerGroup()
    first, second = Probe(nn, tmp_path / "a.out", group), Probe(nn, tmp_path / "b.out", group)
    listener, port = first.listener()
    sibling = second.socket()
    assert second("sock_bind", sibling, second.address("127.0.0.1"), 0) == 0  # as the first did: port 0
    assert second("sock_listen", sibling, 5) == 0
    assert probe_port(second, sibling) == port
    for probe, fd in ((first, listener), (second, sibling)):
        assert probe("fd_fdstat_set_flags", fd, NONBLOCK) == 0
    clients = [socket.create_connection(("127.0.0.1", port), timeout=WAIT) for _ in range(3)]
    for client in clients:
        client.sendall(b"x")  # a request on every connection
    try:
        assert first("sock_accept", listener, 0, FD) == 0
        conn = first.u32(FD)
        assert first("sock_accept", listener, 0, FD) == AGAIN  # one per poll, though two more wait
        subs = [fd_sub(7, 1, listener), fd_sub(8, 1, conn)]
        assert [event[0] for event in first.poll(subs)] == [8]  # its request first: the listener held back
        assert sorted(event[0] for event in first.poll(subs)) == [7, 8]  # then both
        assert first("sock_accept", listener, 0, FD) == 0
        assert second("sock_accept", sibling, 0, FD) == 0  # the third, from the one queue
        assert second("sock_accept", sibling, 0, FD) == AGAIN
    finally:
        for client in clients:
            client.close()
        first.nn.detach(first.store)
        second.nn.detach(second.store)
    assert len(group) == 0

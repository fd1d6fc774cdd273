"""Reachability probe shipped to nodes (standard library only, Python >= 3.6).

``listen DEADLINE_S PORT,PORT,...``: bind the ports on every address, print
``{"pid": P, "bound": [...], "busy": [...], "listened": [...]}`` and keep accepting in the
background until the deadline (or until killed), so the SSH command returns at once.
``busy`` are the ports it could not bind; ``listened`` those of them another program
listens on (the others are the local ports of the node's own connections, which answer
no connect).

``connect TIMEOUT_S [PARALLEL [LOW-HIGH]]``: read a JSON list of ``[target, address, port]``
on stdin (a plan of any size: it never travels on the command line), connect to each, at
most PARALLEL (default 256) at a time, and print
``{"target port": "open|refused|filtered|no route|error: ..."}`` on its last line, after
``{"tcp": {"target": [retransmitted, sent]}}``: the segments of the connects each target
answered (open or refused), from each socket's tcp_info. With LOW-HIGH, each
connect leaves from a source port of that band (each worker its own port, closed with a
reset so the port is free again at once), else from an ephemeral port.
"""

import errno
import json
import os
import selectors
import socket
import struct
import sys
import threading
import time

# The connects a target answered: their retransmits are the path's. A filtered port's SYNs
# are sent again by design, and count against no one.
ANSWERED = ("open", "refused")


def listening_ports():
    """The TCP ports something on this node listens on (/proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":
                        found.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return found


def listen(deadline_s, ports):
    socks, bound, busy = [], [], []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
            sock.listen(128)
        except OSError:
            busy.append(port)
            sock.close()
            continue
        sock.setblocking(False)
        socks.append(sock)
        bound.append(port)
    listened = sorted(set(busy) & listening_ports()) if busy else []
    pid = os.fork()
    if pid:
        print(json.dumps({"pid": pid, "bound": bound, "busy": busy, "listened": listened}),
              flush=True)
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for key, _ in selector.select(timeout=0.5):
            try:
                conn, _ = key.fileobj.accept()
                conn.close()
            except OSError:
                pass
    os._exit(0)


def _bound_socket(source_port):
    """A TCP socket bound to ``source_port`` (closing it sends a reset), or to an ephemeral
    port when ``source_port`` is None or cannot be bound."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if source_port is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        try:
            sock.bind(("0.0.0.0", source_port))
        except OSError:
            sock.close()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    return sock


def tcp_counts(sock):
    """(segments retransmitted, segments sent) of the socket, from the kernel's tcp_info:
    tcpi_total_retrans at byte 100, tcpi_segs_out at byte 136 (Linux 4.2); None when not
    given (this probe ships alone, so it does not share probe_common's reader)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 140)
    except OSError:
        return None
    if len(info) < 140:
        return None
    return struct.unpack_from("=I", info, 100)[0], struct.unpack_from("=I", info, 136)[0]


def _state(sock, address, port):
    try:
        sock.connect((address, port))
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "filtered"
    except OSError as exc:
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route"
        return "error: " + str(exc)


def classify(address, port, timeout_s, source_port=None):
    """The port's state and the connect's (retransmitted, sent) segments, or None."""
    sock = _bound_socket(source_port)
    sock.settimeout(timeout_s)
    try:
        state = _state(sock, address, port)
        return state, tcp_counts(sock)
    finally:
        sock.close()


def connect(timeout_s, targets, parallel, band=None):
    results, tcp = {}, {}
    lock = threading.Lock()
    pending = list(reversed(targets))

    def worker(source_port):
        while True:
            with lock:
                if not pending:
                    return
                target, address, port = pending.pop()
            state, counts = classify(address, port, timeout_s, source_port)
            with lock:
                results[f"{target} {port}"] = state
                if counts is not None and state in ANSWERED:
                    sums = tcp.setdefault(target, [0, 0])
                    sums[0] += counts[0]
                    sums[1] += counts[1]

    count = min(parallel, len(targets))
    if band is not None:
        count = min(count, band[1] - band[0] + 1)
    ports = [band[0] + i if band else None for i in range(count)]
    threads = [threading.Thread(target=worker, args=(p,)) for p in ports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"tcp": tcp}, sort_keys=True), flush=True)
    print(json.dumps(results, sort_keys=True), flush=True)


def main():
    mode = sys.argv[1]
    if mode == "listen":
        listen(float(sys.argv[2]), [int(p) for p in sys.argv[3].split(",") if p])
    elif mode == "connect":
        parallel = int(sys.argv[3]) if len(sys.argv) > 3 else 256
        band = tuple(int(p) for p in sys.argv[4].split("-")) if len(sys.argv) > 4 else None
        connect(float(sys.argv[2]), json.load(sys.stdin), parallel, band)
    else:
        sys.exit("usage: reachability.py listen DEADLINE PORTS | connect TIMEOUT [PARALLEL "
                 "[LOW-HIGH]] < TARGETS_JSON")


if __name__ == "__main__":
    main()

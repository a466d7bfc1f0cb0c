#!/usr/bin/env python3
"""The testbed links' machine ceiling: plain TCP, every host at once (run by the testbed in each
host's namespace, by perf/cluster_bench.sh, perf/ps_bench.sh and perf/hvd_bench.sh; not by hand).

    link_ceiling.py --hosts H --bytes B --port PORT [--streams S]

Every host streams B bytes of plain TCP (S connections, default 4) over d0 to the next host while
receiving B from the previous one, all at once: what the shaped links and this machine's CPUs
carry with every host sending and receiving. Each host prints "CEILING seconds". No gradwire in it.
(On the 2-core build VM one connection per link carries more than four: 8.8 against 6.9 Gbit/s at
10gbit, 256 MiB.)
"""
import argparse
import os
import socket
import threading
import time

def ip(rank: int) -> str:
    return f"10.77.0.{rank + 1}"  # the testbed's data address of host `rank`


def ceiling(r: int, n: int, nbytes: int, port: int, streams: int = 4) -> float:
    """Seconds to send nbytes to the next host while receiving nbytes from the previous, over
    `streams` connections each way (all connections are made, and a start byte exchanged, before
    the clock starts)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip(r), port))
    srv.listen(streams)
    deadline = time.monotonic() + 60
    outs = []
    while len(outs) < streams:
        try:
            outs.append(socket.create_connection((ip((r + 1) % n), port), timeout=60))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    ins = [srv.accept()[0] for _ in range(streams)]
    # Ready: each host says so to the next and waits for the previous one's word; then the
    # ring is all connected, and the streams start within a hop's latency of each other.
    for o in outs:
        o.settimeout(None)
        o.sendall(b"r")
    for c in ins:
        assert c.recv(1) == b"r"
    share = nbytes // streams
    got = [0] * streams
    payload = memoryview(bytearray(share))

    def recv(i: int) -> None:
        buf = bytearray(4 << 20)
        while got[i] < share:
            k = ins[i].recv_into(buf)
            if k == 0:
                break
            got[i] += k

    def send(i: int) -> None:
        outs[i].sendall(payload)  # one call: the kernel's loop, not Python's

    threads = [threading.Thread(target=f, args=(i,)) for i in range(streams) for f in (recv, send)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dt = time.monotonic() - t0
    for c in outs + ins + [srv]:
        c.close()
    assert sum(got) == share * streams, f"ceiling: received {sum(got)} of {share * streams} bytes"
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--streams", type=int, default=4)
    a = ap.parse_args()
    secs = ceiling(int(os.environ["TB_HOST"]), a.hosts, a.bytes, a.port, a.streams)
    print(f"CEILING {secs:.4f}", flush=True)


if __name__ == "__main__":
    main()

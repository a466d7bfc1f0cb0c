"""gradwire-run: start the ranks of a job, like horovodrun or torchrun.

    gradwire-run -np 4 -- python3 train.py --epochs 3
    gradwire-run -np 4 -H host1:2,host2:2 -- python3 train.py
    python3 -m gradwire.run -np 2 -- python3 train.py

Each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT) and GW_STORE (a second port beside MASTER_PORT, so gradwire's store and
torch's own TCPStore do not compete for one port). Unless GW_JOB_TOKEN is already set, every
rank also gets the same GW_JOB_TOKEN, 128 random bits generated for this job, so the store and
every connection of the job prove it (docs/security.md); a stranger who reaches the ports cannot
join. Every line a rank prints is prefixed with "[rank]". SIGINT, SIGTERM and SIGHUP are
forwarded to every rank, and a rank still running --grace seconds after the first of them is
killed (SIGKILL, with a line saying so). When a rank exits non-zero (or is killed) the others are
sent SIGTERM, then SIGKILL after --grace seconds, and gradwire-run exits with the first failing
rank's status (128 + signal for a signal).

With --servers S, S parameter-server processes (gradwire.kv, docs/parameter-server.md) start
beside the ranks: each runs `python3 -m gradwire.kv` (the interpreter gradwire-run runs in, or
--server-command) with GW_ROLE=server, GW_KV_SERVERS=S, GW_KV_SERVER_RANK=i, the job's
MASTER_ADDR, MASTER_PORT, GW_STORE and GW_JOB_TOKEN, and WORLD_SIZE (the number of workers), its
output prefixed "[s<i>]"; every rank gets GW_KV_SERVERS=S too. Servers run on this host, or on
--server-hosts. A server that fails ends the job like a failing rank; once every rank has exited
0 the servers get --grace seconds to finish (they stop when every worker has destroyed its
stores) and are then ended with SIGTERM without failing the job.

Ranks on hosts other than this one (-H) are started with ssh (BatchMode, the same working
directory and the variables above on the command line, except the job token, which the remote
shell reads from its standard input so that it never shows in a process list); this needs
password-less ssh and the same paths on every host, and it is not tested in this repository (one
machine).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Optional

from ._ports import free_ports

_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def _is_local(host: str) -> bool:
    return host in _LOCAL_NAMES or host in (socket.gethostname(), socket.getfqdn())


def parse_hosts(spec: Optional[str], np_: int) -> list[tuple[str, int]]:
    """"h1:2,h2:2" -> [("h1", 2), ("h2", 2)]; None -> [("localhost", np_)]."""
    if not spec:
        return [("localhost", np_)]
    out = []
    for item in spec.split(","):
        host, _, slots = item.strip().partition(":")
        if not host:
            raise ValueError(f"-H: empty host name in {spec!r}")
        try:
            n = int(slots) if slots else 1
        except ValueError:
            raise ValueError(f"-H: slots of {host!r} is not a number: {slots!r}") from None
        if n < 1:
            raise ValueError(f"-H: {host} has {n} slots")
        out.append((host, n))
    return out


def plan(np_: int, hosts: list[tuple[str, int]]) -> list[tuple[str, int, int, int, int]]:
    """(host, rank, local_rank, local_world_size, group_rank) for every rank, hosts in order."""
    total = sum(n for _, n in hosts)
    if np_ > total:
        raise ValueError(f"-np {np_} exceeds the {total} slots of -H")
    out = []
    rank = 0
    for group, (host, n) in enumerate(hosts):
        k = min(n, np_ - rank)
        for lr in range(k):
            out.append((host, rank, lr, k, group))
            rank += 1
        if rank == np_:
            break
    return out


class Launcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: list[subprocess.Popen] = []  # the ranks, then the servers
        self.servers: list[subprocess.Popen] = []
        self.failed: Optional[tuple[int, int]] = None  # (rank, exit status)
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.stopping = False
        self.escalating = False
        # The user's token, or one generated for this job (never printed).
        self.user_token = os.environ.get("GW_JOB_TOKEN", "")
        self.token = self.user_token or secrets.token_hex(16)

    def _env(self, rank: int, lr: int, lws: int, group: int, addr: str, ports: list[int]) -> dict:
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.args.np),
            "LOCAL_RANK": str(lr),
            "LOCAL_WORLD_SIZE": str(lws),
            "GROUP_RANK": str(group),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.args.np),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(ports[0]),
            "GW_STORE": f"{addr}:{ports[1]}",
            "TORCHELASTIC_RUN_ID": "gradwire-run",
        }

    def _server_env(self, i: int, addr: str, ports: list[int]) -> dict:
        return {
            "GW_ROLE": "server",
            "GW_KV_SERVERS": str(self.args.servers),
            "GW_KV_SERVER_RANK": str(i),
            "WORLD_SIZE": str(self.args.np),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(ports[0]),
            "GW_STORE": f"{addr}:{ports[1]}",
            "TORCHELASTIC_RUN_ID": "gradwire-run",
        }

    def _pump(self, rank, stream: IO[bytes], out: IO[bytes], remote: bool = False) -> None:
        prefix = b"" if self.args.no_prefix else f"[{rank}] ".encode()  # rank: int, or "s<i>"
        secret = self.token.encode() if remote else None
        for line in iter(stream.readline, b""):
            if secret is not None and line.rstrip(b"\r\n") == secret:
                continue  # the remote pty echoing the token ssh handed it on stdin
            with self.out_lock:
                out.write(prefix + line)
                out.flush()
        stream.close()

    def start(self) -> None:
        hosts = parse_hosts(self.args.hosts, self.args.np)
        ranks = plan(self.args.np, hosts)
        first = ranks[0][0]
        addr = self.args.master_addr or ("127.0.0.1" if _is_local(first) else first)
        ports = [self.args.master_port, self.args.master_port + 1] if self.args.master_port \
            else free_ports(2)
        threads = []
        self.threads = threads
        jobs = [(host, rank, self._env(rank, lr, lws, group, addr, ports), list(self.args.command))
                for host, rank, lr, lws, group in ranks]
        if self.args.servers:
            for e in jobs:
                e[2]["GW_KV_SERVERS"] = str(self.args.servers)
            shosts = parse_hosts(self.args.server_hosts, self.args.servers)
            scmd = shlex.split(self.args.server_command) if self.args.server_command \
                else [sys.executable, "-m", "gradwire.kv"]
            # Servers first: they are listening by the time the workers make their stores.
            jobs = [(host, f"s{i}", self._server_env(i, addr, ports), scmd)
                    for host, _, i, _, _ in plan(self.args.servers, shosts)] + jobs
        for host, rank, env, command in jobs:
            if self.failed is not None:
                break  # a signal arrived while starting: the ranks started so far got it
            stdin_data = None
            if _is_local(host):
                cmd = command
                penv = dict(os.environ, **env)
                penv["GW_JOB_TOKEN"] = self.token
            else:
                assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                # The token on the command line would show in `ps` on the remote host: the
                # remote shell reads it from stdin instead.
                remote = "stty -echo 2>/dev/null; IFS= read -r GW_JOB_TOKEN; " \
                    f"export GW_JOB_TOKEN; cd {shlex.quote(os.getcwd())} && env {assigns} " + \
                    " ".join(shlex.quote(c) for c in command)
                cmd = ["ssh", "-o", "BatchMode=yes", "-tt", host, remote]
                penv = dict(os.environ)
                stdin_data = (self.token + "\n").encode()
            # Own process group: a terminal's Ctrl-C reaches gradwire-run, which forwards it
            # once, and a rank's children are ended with it.
            p = subprocess.Popen(cmd, env=penv,
                                 stdin=subprocess.PIPE if stdin_data else subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
            if stdin_data is not None:
                p.stdin.write(stdin_data)
                p.stdin.close()
            p.gw_rank = rank  # type: ignore[attr-defined]
            self.procs.append(p)
            if isinstance(rank, str):
                self.servers.append(p)
            for stream, out in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=self._pump,
                                     args=(rank, stream, out, stdin_data is not None),
                                     daemon=True)
                t.start()
                threads.append(t)

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def escalate(self, sig: int) -> None:
        """After a forwarded signal: SIGKILL the ranks still running --grace seconds later."""
        with self.lock:
            if self.escalating:
                return
            self.escalating = True

        def later() -> None:
            deadline = time.monotonic() + self.args.grace
            while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
                time.sleep(0.05)
            for p in self.procs:
                if p.poll() is None:
                    rank = p.gw_rank  # type: ignore[attr-defined]
                    with self.out_lock:
                        sys.stderr.write(f"gradwire-run: rank {rank} still running "
                                         f"{self.args.grace:g} s after signal {sig}; killing it\n")
                        sys.stderr.flush()
            self.signal_all(signal.SIGKILL)

        threading.Thread(target=later, daemon=True).start()

    def stop_all(self) -> None:
        with self.lock:
            if self.stopping:
                return
            self.stopping = True
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + self.args.grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        self.signal_all(signal.SIGKILL)

    def wait(self) -> int:
        live = list(self.procs)
        workers_done_at: Optional[float] = None
        ended: set = set()  # servers this launcher ended after the ranks' success
        while live:
            if self.servers and workers_done_at is None and self.failed is None and \
                    all(p.poll() == 0 for p in self.procs if p not in self.servers):
                workers_done_at = time.monotonic()
            if workers_done_at is not None and \
                    time.monotonic() - workers_done_at > self.args.grace:
                # Every rank succeeded: a server still serving is ended, not counted a failure.
                for p in self.servers:
                    if p.poll() is None:
                        ended.add(p)
                        try:
                            os.killpg(p.pid, signal.SIGTERM)
                        except ProcessLookupError:
                            pass
                workers_done_at = float("inf")
                threading.Thread(target=self.stop_all, daemon=True).start()
            for p in list(live):
                rc = p.poll()
                if rc is None:
                    continue
                live.remove(p)
                if rc != 0 and self.failed is None and p not in ended:
                    self.failed = (p.gw_rank, rc)  # type: ignore[attr-defined]
                    if not self.stopping:
                        how = f"signal {-rc}" if rc < 0 else f"status {rc}"
                        who = p.gw_rank  # type: ignore[attr-defined]
                        who = f"server {who[1:]}" if isinstance(who, str) else f"rank {who}"
                        with self.out_lock:
                            sys.stderr.write(f"gradwire-run: {who} exited with {how}; "
                                             "ending the other ranks\n")
                            sys.stderr.flush()
                    threading.Thread(target=self.stop_all, daemon=True).start()
            time.sleep(0.02)
        for t in self.threads:
            t.join(timeout=2)
        if self.failed is None:
            return 0
        rc = self.failed[1]
        return 128 - rc if rc < 0 else rc


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gradwire-run",
        description="Start N ranks of a program with torchrun-compatible variables.",
        usage="gradwire-run -np N [-H host1:2,host2:2] [options] -- program [args...]")
    ap.add_argument("-np", "--np", type=int, required=True, dest="np", help="number of ranks")
    ap.add_argument("-H", "--hosts", help="host:slots,... (default: all ranks on this host)")
    ap.add_argument("--master-addr", help="address of rank 0's host (default: the first host)")
    ap.add_argument("--master-port", type=int, default=0,
                    help="MASTER_PORT; GW_STORE gets the next port (default: two free ports "
                    "below the ephemeral range)")
    ap.add_argument("--grace", type=float, default=5.0,
                    help="seconds between SIGTERM (or a forwarded signal) and SIGKILL when "
                    "ending the ranks (default 5)")
    ap.add_argument("--servers", type=int, default=0,
                    help="also start S parameter-server processes (GW_ROLE=server, "
                    "python3 -m gradwire.kv) for gradwire.kv stores (default 0: the servers run "
                    "inside the workers)")
    ap.add_argument("--server-hosts", help="host:slots,... for the servers (default: this host)")
    ap.add_argument("--server-command",
                    help="what a server runs (default: this interpreter -m gradwire.kv)")
    ap.add_argument("--no-prefix", action="store_true", help="do not prefix output with [rank]")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- program [args...]")
    args = ap.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        ap.error("no program given (gradwire-run -np N -- program args)")
    if args.np < 1:
        ap.error(f"-np {args.np}: need at least one rank")
    if args.servers < 0:
        ap.error(f"--servers {args.servers}: must be >= 0")
    launcher = Launcher(args)

    def forward(sig: int, _frame: object) -> None:
        launcher.signal_all(sig)
        if launcher.failed is None:
            launcher.failed = (-1, -sig)
        launcher.escalate(sig)

    # Before any rank starts: a signal that comes as soon as a rank has spoken is forwarded, not
    # the end of gradwire-run with its ranks left running.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    try:
        launcher.start()
    except (ValueError, OSError) as e:
        sys.stderr.write(f"gradwire-run: {e}\n")
        launcher.signal_all(signal.SIGKILL)
        return 2
    return launcher.wait()


if __name__ == "__main__":
    sys.exit(main())

"""Listen on one address: a TensorFlow server restricted to loopback or to a private interface.

TensorFlow 2.21's gRPC server always listens on every interface of its port: ``GrpcServer::Init``
(``tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc``) calls ``AddListeningPort("0.0.0.0:<port>")``
whatever host the task's address names, and no option changes that. A task started with ``--bind ADDRESS``
therefore runs with a tiny ``LD_PRELOAD`` library (``SHIM_SOURCE``, built once with the system's C compiler into
``~/.cache/study-ps``) that turns that wildcard ``bind()`` into a bind to ``ADDRESS``; the task then reads
``/proc/net/tcp*`` and exits with an error unless its port listens on ``ADDRESS`` only (``check_listening``).
Linux (glibc) only. Every other ``bind()`` passes through unchanged.

``python -m study.ps --bind 127.0.0.1`` (one machine) or ``--bind 10.0.0.5`` (the machine's private address).

This narrows who can connect; it does not authenticate anyone. A TensorFlow server runs any graph it is sent,
so a cluster belongs on a private network whatever it binds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENV = "STUDY_PS_BIND"
"""The environment variable the shim reads: the address to bind instead of the wildcard."""

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* bind() to the address in STUDY_PS_BIND instead of the IPv4 or IPv6 wildcard; anything else unchanged. */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t) = 0;
    if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    const char *want = getenv("STUDY_PS_BIND");
    struct in_addr v4;
    struct in6_addr v6;
    if (!want || !addr) return real(fd, addr, len);
    int is4 = inet_pton(AF_INET, want, &v4) == 1, is6 = inet_pton(AF_INET6, want, &v6) == 1;
    if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr != htonl(INADDR_ANY)) return real(fd, addr, len);
        if (!is4) { errno = EADDRNOTAVAIL; return -1; }
        a.sin_addr = v4;
        return real(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (memcmp(&a.sin6_addr, &in6addr_any, sizeof a.sin6_addr) != 0) return real(fd, addr, len);
        if (is4) {  /* an IPv4 address on a dual-stack socket: its v4-mapped form */
            memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
            a.sin6_addr.s6_addr[10] = 0xff;
            a.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&a.sin6_addr.s6_addr[12], &v4, 4);
        } else if (is6) {
            a.sin6_addr = v6;
        } else {
            errno = EADDRNOTAVAIL;
            return -1;
        }
        return real(fd, (struct sockaddr *)&a, sizeof a);
    }
    return real(fd, addr, len);
}
"""


class BindError(RuntimeError):
    """``--bind`` cannot be honoured here; the message says why and what to do instead."""


def check_address(address: str) -> str:
    """``address`` as a normalised IP address, else a ``ValueError``. ``check_address("127.0.0.1")``"""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise ValueError(f"--bind: expected an IP address of this machine (127.0.0.1 for one machine, or its "
                         f"private address such as 10.0.0.5); got {address!r}") from None


def shim_path() -> Path:
    """Where the built library is cached: ``$XDG_CACHE_HOME/study-ps`` (default ``~/.cache``), keyed by its source."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "study-ps"
    digest = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:12]
    return cache / f"libstudy_ps_bind-{digest}.so"


def build_shim() -> Path:
    """Build the ``LD_PRELOAD`` library once (cached); a ``BindError`` says why it cannot. ``build_shim()``"""
    if not sys.platform.startswith("linux"):
        raise BindError(f"--bind: works on Linux only (an LD_PRELOAD shim); this is {sys.platform}. TensorFlow's "
                        "server listens on every interface: keep the cluster on a private network or firewall it")
    path = shim_path()
    if path.is_file():
        return path
    compiler = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if compiler is None:
        raise BindError("--bind: needs a C compiler (cc, gcc or clang) to build a 60-line bind() shim once, because "
                        "TensorFlow's server always listens on 0.0.0.0; install one, or leave --bind out and keep the "
                        "cluster on a private network or behind a firewall")
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.with_suffix(f".{os.getpid()}.c")
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    source.write_text(SHIM_SOURCE)
    try:
        run = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(source), "-ldl"],
                             capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            raise BindError(f"--bind: building the bind() shim with {compiler} failed: {run.stderr.strip()[-500:]}")
        os.replace(tmp, path)
    finally:
        source.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return path


def available() -> bool:
    """Whether ``--bind`` works here (Linux with a C compiler, or the library already built). ``available()``"""
    try:
        build_shim()
        return True
    except BindError:
        return False


def environment(address: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) plus what makes a new process bind ``address``. ``environment("127.0.0.1")``"""
    env = dict(os.environ if env is None else env)
    shim = str(build_shim())
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != shim]
    env["LD_PRELOAD"] = ":".join([shim, *preload])
    env[ENV] = check_address(address)
    return env


def active() -> str | None:
    """The address this process binds when the shim is loaded in it, else None."""
    wanted = os.environ.get(ENV)
    loaded = any(Path(p).name.startswith("libstudy_ps_bind") for p in os.environ.get("LD_PRELOAD", "").split(":"))
    return wanted if wanted and loaded else None


def _own_sockets() -> set[str]:
    """Inodes of this process's sockets, from ``/proc/self/fd``."""
    inodes = set()
    for fd in Path("/proc/self/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listening(port: int, own: bool = False) -> list[str]:
    """Local addresses with a socket listening on TCP ``port`` (``own``: this process's sockets only), read from
    ``/proc/net/tcp`` and ``tcp6``."""
    mine = _own_sockets() if own else None
    found = []
    for name, width in (("tcp", 4), ("tcp6", 16)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A" or (mine is not None and fields[9] not in mine):  # 0A: LISTEN
                continue
            host, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(host)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))  # each 32-bit word is little-endian
            found.append(str(ipaddress.ip_address(raw)))
    return found


def describe(addresses: list[str]) -> str:
    """``["0.0.0.0"]`` -> ``"every interface (0.0.0.0)"``; else the addresses, v4-mapped ones in v4 form."""
    shown = sorted({plain(a) for a in addresses})
    if any(ipaddress.ip_address(a).is_unspecified for a in shown):
        return f"every interface ({', '.join(shown)})"
    return ", ".join(shown) or "nothing yet"


def check_listening(port: int, address: str) -> None:
    """Raise ``BindError`` unless this process listens on ``port`` at ``address`` and nowhere else.

    ``check_listening(2222, "127.0.0.1")``
    """
    seen = {plain(a) for a in listening(port, own=True)}
    if seen != {plain(address)}:
        raise BindError(f"--bind {address}: port {port} listens on {describe(sorted(seen))}, not on {address} only; "
                        "stopping rather than serving more widely than asked")


def plain(address: str) -> str:
    """An address in its plain form: a v4-mapped IPv6 address as IPv4. ``plain("::ffff:127.0.0.1") == "127.0.0.1"``"""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)

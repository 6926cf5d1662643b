"""Listen on one address: a TensorFlow server restricted to loopback or to a private interface.

TensorFlow 2.21's gRPC server always listens on every interface of its port, IPv4 and IPv6: ``GrpcServer::Init``
(``tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc``) calls ``AddListeningPort("[::]:<port>")``
whatever host the task's address names, and no option changes that. A task (on 127.0.0.1 by default, or
``--bind ADDRESS``) therefore runs with a tiny ``LD_PRELOAD`` library (``SHIM_SOURCE``, built once with the system's C
compiler into ``~/.cache/downpour``) that turns that wildcard ``bind()`` into a bind to ``ADDRESS``; the task then reads
``/proc/net/tcp*`` and exits with an error unless its port listens on ``ADDRESS`` only (``check_listening``).
Linux (glibc) only. Every other ``bind()`` passes through unchanged.

Nothing falls back silently: without a compiler ``--bind`` stops with one message (``BindError``), and
``LocalCluster`` refuses to start rather than listen more widely. The cached library is loaded only after a
check: its file name carries the SHA-256 of the source, the compiler flags and the compiler, and a manifest
next to it records that key and the library's own SHA-256; a library whose bytes or key differ is built again,
and a cache folder that other users can write is refused.

A task listens on 127.0.0.1 unless ``--bind`` names another address: ``--bind 10.0.0.5`` (the machine's private
address, for a cluster of several machines); ``--bind 0.0.0.0`` (or ``::``) is TensorFlow's own every-interface
listening, with no shim, and the task prints a warning line.

This narrows who can connect; it does not authenticate anyone. A TensorFlow server runs any graph it is sent,
so a cluster belongs on a private network whatever it binds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENV = "DOWNPOUR_BIND"
"""The environment variable the shim reads: the address to bind instead of the wildcard."""
DEFAULT = "127.0.0.1"
"""The address a task listens on when ``--bind`` is not given: loopback, this machine only."""

SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* bind() to the address in DOWNPOUR_BIND instead of the IPv4 or IPv6 wildcard; anything else unchanged. */
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real)(int, const struct sockaddr *, socklen_t) = 0;
    if (!real) real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    const char *want = getenv("DOWNPOUR_BIND");
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


def every_interface(address: str) -> bool:
    """Whether ``address`` is a wildcard (``0.0.0.0``, ``::``): TensorFlow's own behaviour, every interface, no shim.

    ``every_interface("0.0.0.0") and not every_interface("127.0.0.1")``
    """
    return ipaddress.ip_address(address).is_unspecified


def wide_warning(task: str, address: str, port: int | str) -> str:
    """The one line a task prints when ``--bind`` asks for every interface."""
    return (f"warning: {task} listens on every interface (--bind {address}): anyone who reaches port {port} can read "
            "and overwrite the model and run code as this task's user; keep the cluster on a private network")


def check_address(address: str) -> str:
    """``address`` as a normalised IP address, else a ``ValueError``. ``check_address("127.0.0.1")``"""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        raise ValueError(f"--bind: expected an IP address of this machine (127.0.0.1 for one machine, or its "
                         f"private address such as 10.0.0.5); got {address!r}") from None


FLAGS = ("-shared", "-fPIC", "-O2")
"""The compiler flags the shim is built with (part of its cache key)."""
LIBS = ("-ldl",)


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/downpour`` (default ``~/.cache/downpour``)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "downpour"


def compiler() -> str | None:
    """The C compiler to build the shim with: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on ``PATH``; None if none."""
    return next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


def shim_key(cc: str | None = None) -> str:
    """SHA-256 of the shim's source, flags and compiler path: what a cached library must have been built from."""
    text = "\0".join([SHIM_SOURCE, *FLAGS, *LIBS, cc or compiler() or ""])
    return hashlib.sha256(text.encode()).hexdigest()


def shim_path(cc: str | None = None) -> Path:
    """Where the built library is cached, named by ``shim_key``."""
    return cache_dir() / f"libdownpour_bind-{shim_key(cc)[:16]}.so"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_cache_folder(folder: Path) -> None:
    info = folder.stat()
    if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o022):
        raise BindError(f"--bind: refusing to load the bind() shim from {folder}: the folder belongs to another user "
                        "or others can write to it; make it yours with mode 700, or set XDG_CACHE_HOME elsewhere")


def cached_shim(cc: str | None = None) -> Path | None:
    """The cached library if it passes its check (name, manifest, the library's SHA-256), else None."""
    path = shim_path(cc)
    manifest = path.with_suffix(".json")
    if not path.is_file() or not manifest.is_file():
        return None
    _check_cache_folder(path.parent)
    try:
        recorded = json.loads(manifest.read_text())
    except ValueError:
        return None
    if recorded.get("key") != shim_key(cc) or recorded.get("sha256") != _sha256(path):
        return None
    return path


def build_shim() -> Path:
    """The checked ``LD_PRELOAD`` library, built once (cached); a ``BindError`` says why it cannot. ``build_shim()``"""
    if not sys.platform.startswith("linux"):
        raise BindError(f"--bind: listening on one address works on Linux only (an LD_PRELOAD shim); this is "
                        f"{sys.platform}. TensorFlow's server alone listens on every interface: give --bind 0.0.0.0 "
                        "to accept that, on a private network or behind a firewall")
    cc = compiler()
    if cc is None:
        raise BindError("--bind: listening on one address (127.0.0.1 unless --bind names another) needs a C "
                        "compiler (cc, gcc or clang, or $CC) to build a 60-line bind() shim once, because "
                        "TensorFlow's server always listens on every interface ([::]); install one, or give --bind "
                        "0.0.0.0 to listen on every interface, on a private network or behind a firewall")
    found = cached_shim(cc)
    if found is not None:
        return found
    path = shim_path(cc)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _check_cache_folder(path.parent)
    source = path.with_suffix(f".{os.getpid()}.c")
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    source.write_text(SHIM_SOURCE)
    try:
        run = subprocess.run([cc, *FLAGS, "-o", str(tmp), str(source), *LIBS], capture_output=True, text=True,
                             timeout=120)
        if run.returncode != 0:
            raise BindError(f"--bind: building the bind() shim with {cc} failed: "
                            f"{' '.join(run.stderr.strip().splitlines()[-1:])[-300:]}")
        manifest = {"key": shim_key(cc), "sha256": _sha256(tmp), "compiler": cc, "flags": [*FLAGS, *LIBS]}
        os.replace(tmp, path)
        tmp_manifest = path.with_suffix(f".{os.getpid()}.json")
        tmp_manifest.write_text(json.dumps(manifest))
        os.replace(tmp_manifest, path.with_suffix(".json"))
    finally:
        source.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return path


def available() -> bool:
    """Whether ``--bind`` works here (Linux with a C compiler). ``available()``"""
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
    loaded = any(Path(p).name.startswith("libdownpour_bind") for p in os.environ.get("LD_PRELOAD", "").split(":"))
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

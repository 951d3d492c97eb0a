"""The first code that runs inside a local sandbox, passed to `python -I -c`.

It is source, not an imported module: `LocalSandbox` hands this file's text
to the sandboxed interpreter with its config as argv[1] (marshal, in hex; the
payload comes on the control pipe, marshalled too). In order it
(0) joins the run's cgroup, when it has one, (1) builds the private root
when the sandbox is `unshare` (bubblewrap builds it otherwise), (2) drops
to the unprivileged uid when it started as root, (3) waits for the run's
payload on the control pipe -- a warm-pool process waits here --, then
(4) writes the files, sets the rlimits and runs the code as `__main__`.
Only the standard library; nothing here trusts the payload.
"""

# Only built-in modules (no json, no traceback): their imports were half of a run's start-up.
import marshal
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 4096, 8192, 16384, 1 << 18
DEVICES = ("null", "zero", "full", "random", "urandom")


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, src, dst, fstype, flags, data=None):
    enc = [None if s is None else s.encode() for s in (src, dst, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


def _bind_ro(libc, src, dst):
    _mount(libc, src, dst, None, MS_BIND | MS_REC)
    _mount(libc, None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_root(cfg):
    """Builds the sandbox's root the way bubblewrap would, then switches to it."""
    libc = _libc()
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    sources = list(cfg["system_dirs"]) + list(cfg["python_dirs"])
    fds = {p: os.open(p, os.O_PATH) for p in sources if os.path.lexists(p)}
    root = "/tmp"  # any existing dir: the host's /tmp is only covered, in this namespace
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in cfg["system_dirs"]:
        if path not in fds:
            continue
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
            continue
        os.makedirs(root + path, exist_ok=True)
        _bind_ro(libc, f"/proc/self/fd/{fds[path]}", root + path)
    os.makedirs(root + "/dev")
    _mount(libc, "tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=0755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        _mount(libc, f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"{root}/dev/{name}")
    os.symlink("/proc/self/fd/1", root + "/dev/stdout")
    os.symlink("/proc/self/fd/2", root + "/dev/stderr")
    size = cfg["tmpfs_bytes"]
    for path in (cfg["workdir"], "/tmp", "/dev/shm"):
        os.makedirs(root + path, exist_ok=True)
        _mount(libc, "tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    # as bubblewrap's: only the devices and /dev/shm's capped tmpfs are writable in /dev
    _mount(libc, None, root + "/dev", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
    # The Python dirs come after the tmpfs mounts: a venv under /tmp (a CI checkout)
    # would otherwise be hidden by the private /tmp.
    for path in cfg["python_dirs"]:
        if path in fds and path not in cfg["system_dirs"]:
            os.makedirs(root + path, exist_ok=True)
            _bind_ro(libc, f"/proc/self/fd/{fds[path]}", root + path)
    os.makedirs(root + "/proc")
    _mount(libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV)
    for fd in fds.values():
        os.close(fd)
    os.chdir(root)
    _mount(libc, root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")
    _mount(libc, None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def drop_privileges(uid):
    """Becomes `uid` with no groups and no capabilities; no_new_privs for good measure."""
    libc = _libc()  # loaded first: the new uid may not be able to read the stdlib's path
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # leaving uid 0 clears every capability
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def read_payload(fd):
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return marshal.loads(b"".join(chunks))


def write_files(workdir, files):
    for name, text in files.items():
        rel = os.path.normpath(name)
        if os.path.isabs(rel) or rel.split(os.sep)[0] == "..":
            raise ValueError(f"file path outside the work dir: {name!r}")
        path = os.path.join(workdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def set_limits(limits):
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def join_group(fds):
    """Moves this process into the run's cgroup (its `cgroup.procs` files, opened by the
    sandbox): all it starts later is in the group too. Exits rather than run unbounded."""
    try:
        for fd in fds:
            os.write(fd, b"0")
            os.close(fd)
    except OSError as exc:
        os.write(2, f"agentgym sandbox: cannot join the run's cgroup: {exc}\n".encode())
        os._exit(125)


def main():
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    join_group(cfg["join_fds"])
    if cfg.get("build_root"):
        build_root(cfg)
    if cfg.get("uid") is not None and os.getuid() == 0:
        drop_privileges(cfg["uid"])
    payload = read_payload(cfg["control_fd"])
    workdir = cfg["workdir"]
    os.chdir(workdir)
    write_files(workdir, {**payload["files"], "main.py": payload["code"]})
    sys.argv = ["main.py"]
    sys.path.insert(0, workdir)
    set_limits(payload["limits"])
    module = type(sys)("__main__")
    module.__file__ = os.path.join(workdir, "main.py")
    sys.modules["__main__"] = module
    try:
        exec(compile(payload["code"], module.__file__, "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # the code's own exception: print it without this frame
        assert exc.__traceback__ is not None  # a caught exception has one
        exc = exc.with_traceback(exc.__traceback__.tb_next)  # the hook prints exc's own
        sys.__excepthook__(type(exc), exc, exc.__traceback__)  # C code: works out of memory
        sys.exit(1)


main()

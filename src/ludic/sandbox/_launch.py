"""Sandbox launcher: applies isolation a plain process can give itself, then execs the program.

Run as `python3 -I -S -c <this file's text> <config JSON> <argv...>`; it must not import
ludic (it runs in the sandbox, possibly under another interpreter). Steps, each optional:
wait at a gate (one byte on `block_fd`: the host moves us into a memory cgroup first), new
network namespace, drop to an unprivileged uid, no_new_privs, rlimits, chdir, execve
with a clean environment. A step that was asked for and fails exits 126 with a message.
Before the execve, SIGPIPE and SIGXFSZ go back to their default action: this interpreter
ignores both at startup and an ignored signal stays ignored across execve, so a program would
get EPIPE / EFBIG where `prlimit` or a shell lets the signal end it (a write over the file cap
killed by SIGXFSZ, as `subprocess`'s restore_signals does for its children).
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
SIGKILL = 9
FAILED = 126


def fail(message):
    sys.stderr.write("ludic-sandbox launcher: " + message + "\n")
    sys.stderr.flush()
    os._exit(FAILED)


def libc_call(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def own_task_count(uid):
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat("/proc/" + pid).st_uid == uid:
                    count += len(os.listdir("/proc/" + pid + "/task"))
            except OSError:
                pass
    return count


def main():
    config = json.loads(sys.argv[1])
    argv = sys.argv[2:]
    block_fd = config.get("block_fd")
    if block_fd is not None:
        opened = os.read(block_fd, 1)
        os.close(block_fd)
        if not opened:
            fail("the host closed the gate without opening it (no cgroup to run in)")
    new_user_ns = False
    if config.get("unshare_net"):
        new_user_ns = os.geteuid() != 0  # unprivileged: the user namespace grants the netns
        flags = CLONE_NEWUSER | CLONE_NEWNET if new_user_ns else CLONE_NEWNET
        problem = libc_call("unshare", flags)
        if problem:
            fail("cannot create a network namespace: " + problem)
    uid = config.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    if libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
        fail("cannot set no_new_privs")
    libc_call("prctl", PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    nproc = config["nproc"]
    if config.get("nproc_on_top_of_own") and not new_user_ns:
        # Our uid's existing tasks count against RLIMIT_NPROC too; allow nproc on top.
        # (In a new user namespace the count starts afresh.)
        nproc += own_task_count(os.getuid())
    limits = {
        resource.RLIMIT_AS: config["as"],
        resource.RLIMIT_CPU: config["cpu"],
        resource.RLIMIT_NPROC: nproc,
        resource.RLIMIT_FSIZE: config["fsize"],
        resource.RLIMIT_CORE: 0,
    }
    for which, soft in limits.items():
        hard = soft + 1 if which == resource.RLIMIT_CPU else soft
        current_hard = resource.getrlimit(which)[1]
        if current_hard != resource.RLIM_INFINITY and hard > current_hard:
            soft, hard = min(soft, current_hard), current_hard
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as exc:
            fail("cannot set rlimit " + str(which) + ": " + str(exc))
    os.chdir(config["cwd"])
    for which in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(which, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, config["env"])
    except OSError as exc:
        fail("cannot run " + argv[0] + ": " + str(exc))


if __name__ == "__main__":
    main()

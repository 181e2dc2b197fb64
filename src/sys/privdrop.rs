//! The system calls of the privilege split: forking the broker, and giving
//! up root for good in the process that reads other users' bytes.
//!
//! Invariants:
//! - P1 `fork_broker` is called before the process has started any thread
//!   of its own (checked through /proc/self/task), so the child's single
//!   thread owns every lock it may take.
//! - P2 `setgroups`, `setresgid` and `setresuid` go through the C library,
//!   which applies them to every thread of the process (glibc's set*id
//!   broadcast), not only to the calling one.
//! - P3 `signal(SIG_IGN)` installs no handler code, so nothing runs in
//!   signal context.

use std::io;

/// Which side of the fork this is.
pub enum Fork {
    Parent { child: u32 },
    Child,
}

/// How many threads the process has now.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

/// Forks; refused when the process already has other threads (P1).
pub fn fork_broker() -> io::Result<Fork> {
    if thread_count() > 1 {
        return Err(io::Error::other(
            "the process already runs threads: cannot fork the broker safely",
        ));
    }
    // SAFETY: P1 — no other thread exists, so the child cannot inherit a
    // lock held by a thread that does not exist in it.
    let pid = unsafe { libc::fork() };
    match pid {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(Fork::Child),
        p => Ok(Fork::Parent { child: p as u32 }),
    }
}

/// Ignores SIGINT, SIGTERM and SIGHUP (the broker acts on its socket's end,
/// not on the terminal's Ctrl-C or hang-up, which reach the whole process
/// group), and SIGPIPE.
pub fn ignore_stop_signals() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: P3 — SIG_IGN is not a handler; no code runs on delivery.
        let old = unsafe { libc::signal(sig, libc::SIG_IGN) };
        if old == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Gives up root for the whole process: no supplementary groups, `gid` and
/// `uid` as real, effective and saved ids (P2). The kernel clears the
/// permitted, effective and ambient capabilities of every thread as their
/// uids all leave 0.
pub fn set_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: P2 — a null list of length 0 is what setgroups(2) documents
    // for "no supplementary groups"; no memory is read.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: P2 — plain integers, applied process-wide by the C library.
    if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: P2 — as above.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

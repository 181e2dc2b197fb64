//! The system calls of the privilege split: forking the broker, and giving
//! up root for good in the process that reads other users' bytes.
//!
//! Invariants:
//! - PD1 `fork_broker` is called before the process has started any thread
//!   of its own (checked through /proc/self/task), so the child's single
//!   thread owns every lock it may take.
//! - PD2 `setgroups`, `setresgid` and `setresuid` go through the C library,
//!   which applies them to every thread of the process (glibc's set*id
//!   broadcast), not only to the calling one.
//! - PD3 `signal(SIG_IGN)` installs no handler code, so nothing runs in
//!   signal context.
//! - PD4 The parent sets `no_new_privs` right after the fork, while it is
//!   still its only thread (PD1): every thread it starts later inherits it,
//!   so after the drop no thread can regain privileges through execve. The
//!   broker, forked before, keeps it clear for the hooks it runs.

use std::io;

/// Which side of the fork this is.
pub(crate) enum Fork {
    Parent { child: u32 },
    Child,
}

/// How many threads the process has now.
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

/// Forks the broker; refused when the process already has other threads
/// (PD1). The parent sets `no_new_privs` (PD4).
pub(crate) fn fork_broker() -> io::Result<Fork> {
    fork_process(true)
}

/// Forks an unprivileged session's keeper, as the broker is forked (PD1),
/// but leaves `no_new_privs` as it was: the session keeps its rights.
pub(crate) fn fork_keeper() -> io::Result<Fork> {
    fork_process(false)
}

fn fork_process(no_new_privs: bool) -> io::Result<Fork> {
    if thread_count() > 1 {
        return Err(io::Error::other(
            "the process already runs threads: cannot fork the broker safely",
        ));
    }
    // SAFETY: PD1 — no other thread exists, so the child cannot inherit a
    // lock held by a thread that does not exist in it.
    let pid = unsafe { libc::fork() };
    match pid {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(Fork::Child),
        p => {
            // PD4: before the parent starts any thread.
            if no_new_privs {
                rustix::thread::set_no_new_privs(true)?;
            }
            Ok(Fork::Parent { child: p as u32 })
        }
    }
}

/// Checks every thread of the process through /proc/self/task: no uid 0
/// (real, effective, saved or filesystem), no permitted or effective
/// capability, `no_new_privs` set. The first thread found short, and why.
pub(crate) fn check_every_thread() -> io::Result<()> {
    for task in std::fs::read_dir("/proc/self/task")? {
        let path = task?.path().join("status");
        // A thread that ended meanwhile has nothing left to check.
        let Ok(status) = std::fs::read_to_string(&path) else {
            continue;
        };
        if let Some(why) = status_problem(&status) {
            return Err(io::Error::other(format!("{}: {why}", path.display())));
        }
    }
    Ok(())
}

/// What keeps one /proc status from being that of a dropped thread.
fn status_problem(status: &str) -> Option<String> {
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.strip_prefix(':'))
                .map(str::trim)
        })
    };
    match field("Uid") {
        Some(ids) if ids.split_whitespace().all(|i| i != "0") => {}
        ids => return Some(format!("uids {ids:?}")),
    }
    for caps in ["CapEff", "CapPrm"] {
        match field(caps) {
            Some(v) if v.chars().all(|c| c == '0') => {}
            v => return Some(format!("{caps} {v:?}")),
        }
    }
    match field("NoNewPrivs") {
        Some("1") => None,
        v => Some(format!("NoNewPrivs {v:?}")),
    }
}

/// Ignores SIGINT, SIGTERM and SIGHUP (the broker acts on its socket's end,
/// not on the terminal's Ctrl-C or hang-up, which reach the whole process
/// group), and SIGPIPE.
pub(crate) fn ignore_stop_signals() -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: PD3 — SIG_IGN is not a handler; no code runs on delivery.
        let old = unsafe { libc::signal(sig, libc::SIG_IGN) };
        if old == libc::SIG_ERR {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Gives up root for the whole process: no supplementary groups, `gid` and
/// `uid` as real, effective and saved ids (PD2). The kernel clears the
/// permitted, effective and ambient capabilities of every thread as their
/// uids all leave 0.
pub(crate) fn set_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: PD2 — a null list of length 0 is what setgroups(2) documents
    // for "no supplementary groups"; no memory is read.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: PD2 — plain integers, applied process-wide by the C library.
    if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: PD2 — as above.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::status_problem;

    #[test]
    fn a_status_passes_only_with_every_uid_dropped_no_capability_and_no_new_privs() {
        let good = "Name:\tx\nUid:\t999\t999\t999\t999\nCapPrm:\t0000000000000000\n\
                    CapEff:\t0000000000000000\nNoNewPrivs:\t1\n";
        assert_eq!(status_problem(good), None);
        for (from, to) in [
            ("999\t999\t999\t999", "999\t0\t999\t999"),
            ("CapEff:\t0000000000000000", "CapEff:\t0000000000000400"),
            ("CapPrm:\t0000000000000000", "CapPrm:\t000001ffffffffff"),
            ("NoNewPrivs:\t1", "NoNewPrivs:\t0"),
            ("NoNewPrivs:\t1\n", ""),
        ] {
            let bad = good.replace(from, to);
            assert!(status_problem(&bad).is_some(), "{bad}");
        }
    }
}

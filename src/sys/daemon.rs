//! `--background`: fork, detach the child (setsid, chdir `/`, stdio to
//! `/dev/null`) and let the parent report the child's pid once the child
//! says it started (or why it could not).
//!
//! Invariants:
//! - D1 `fork` is called before the process has started any thread of its
//!   own, so the child's single thread owns every lock it may take.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

/// Which side of the fork this is.
pub(crate) enum Forked {
    /// The original process; `child` is the detached recorder.
    Parent {
        child: u32,
        status: Result<(), StartupError>,
    },
    /// The detached process: report start-up through this.
    Child(StartupReport),
}

/// Why the background process did not start recording, as the parent
/// learns it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StartupError {
    /// The child closed the channel without a word (it died, say).
    #[error("the background process exited before it started recording")]
    Vanished,
    /// The child's own reason.
    #[error("{0}")]
    Reported(String),
}

/// The child's channel to the waiting parent.
pub(crate) struct StartupReport(Option<UnixStream>);

impl StartupReport {
    /// Tells the parent the session started.
    pub(crate) fn ok(&mut self) {
        self.send("ok\n");
    }
    /// Tells the parent why the session could not start.
    pub(crate) fn failed(&mut self, why: &str) {
        self.send(&format!("error: {why}\n"));
    }
    fn send(&mut self, msg: &str) {
        if let Some(mut s) = self.0.take() {
            let _ = s.write_all(msg.as_bytes());
        }
    }
}

/// Forks and detaches (see the module docs). Call before any thread starts (D1).
#[allow(unsafe_code)]
pub(crate) fn fork_detached() -> std::io::Result<Forked> {
    let (mut parent_end, child_end) = UnixStream::pair()?;
    // SAFETY: D1 — no other thread exists yet, so the child cannot inherit a
    // lock held by a thread that does not exist in it.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid > 0 {
        drop(child_end);
        let mut msg = String::new();
        let _ = parent_end.read_to_string(&mut msg);
        let status = match msg.trim_end() {
            "ok" => Ok(()),
            "" => Err(StartupError::Vanished),
            m => Err(StartupError::Reported(
                m.strip_prefix("error: ").unwrap_or(m).to_string(),
            )),
        };
        return Ok(Forked::Parent {
            child: pid as u32,
            status,
        });
    }
    drop(parent_end);
    rustix::process::setsid()?;
    std::env::set_current_dir("/")?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    rustix::stdio::dup2_stdin(&null)?;
    rustix::stdio::dup2_stdout(&null)?;
    rustix::stdio::dup2_stderr(&null)?;
    Ok(Forked::Child(StartupReport(Some(child_end))))
}

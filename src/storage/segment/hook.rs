//! `--on-segment-closed CMD`: runs a shell command for each closed segment on
//! a thread of its own, so a slow or failing command never holds up
//! recording. Commands run one at a time, in segment order.
//!
//! The command acts on the file the recorder wrote, never on a name
//! someone else could have put there. Just before a run the segment and its
//! sidecar are hard-linked, under their own names, into a directory of the
//! runner's own (mode 0700, made once in the segments' directory); each
//! link is opened and must be the very file the recorder wrote (device and
//! inode), else the command does not run. The command then gets:
//!
//! - stdin: the segment, open for reading;
//! - `$1` (`sh -c 'CMD "$@"' sh LINK`): the segment's link: a path nobody
//!   but the runner's user can change while the command runs, even when
//!   the budget deletes the segment's own name meanwhile;
//! - `RECORDER_SEGMENT_SIDECAR` (the sidecar's link), `RECORDER_SEGMENT_NAME`
//!   (the segment's file name, for naming copies) and
//!   `RECORDER_SEGMENT_INDEX`.
//!
//! A segment whose name is gone before its turn (the budget deleted it), or
//! leads elsewhere, is not run. Where the file system takes no hard link,
//! `$1` is `/dev/stdin` and there is no sidecar path. A command that
//! removes or moves `$1` removes the segment. The links are removed after
//! each run, the directory when the runner ends.
//!
//! The command is checked when the runner is made ([`shell_line`]): its
//! trailing blanks and newlines are dropped, and one that ends where the
//! shell would take the appended path as a command of its own (`;`, `&`,
//! `|`, `!`, `{`, a keyword) is refused.
//!
//! Each command runs in a process group of its own with stdout and stderr
//! into one pipe that the runner drains into a bounded tail
//! ([`OUTPUT_TAIL`] bytes: a command that writes gigabytes costs reads, not
//! memory). The runner waits for the shell itself (a pidfd), never for the
//! pipe's end: a background child that keeps the pipe open does not hold
//! up the next segment. A command still running after its timeout has its
//! whole group killed, and so has one still running when the session ends
//! after its grace period.
//!
//! At most [`MAX_QUEUED`] closed segments wait for their command; past that
//! the newest are not run (counted and logged), so a stuck command cannot
//! grow memory without bound.
//!
//! The interface is small on purpose (start, submit, counts, finish): the
//! runner may live in another process than the writer (the broker, which
//! knows the files it made).

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Pid, Signal};

use crate::storage::create::{FileId, OutputDir, PrivateDir};

/// Closed segments waiting for their command, at most.
pub(crate) const MAX_QUEUED: usize = 1024;
/// How long one command may run before its process group is killed, unless
/// `--hook-timeout` (or `hook_timeout` in NAME.segments.toml) says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes of a command's output kept (its last lines), for the log.
pub(crate) const OUTPUT_TAIL: usize = 4096;
/// Lines of that tail quoted in a failure's message.
const TAIL_LINES: usize = 5;
/// How often the runner looks at the stop flag while a command runs.
const TICK: Duration = Duration::from_millis(50);
/// The runner's own directory in the segments' one: `.NAME.RANDOM`.
const PRIVATE_DIR: &str = "recorder-hook";

/// A command that cannot be run safely with a path appended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HookCommandError {
    #[error("--on-segment-closed: the command is empty")]
    Empty,
    #[error(
        "--on-segment-closed {command:?} ends with {end:?}: the segment's path, appended as the command's last argument, would be run as a command of its own. End the command with a word (a function call, say: 'f() {{ cp \"$1\" /srv/; }}; f')"
    )]
    EndsWith { command: String, end: String },
}

/// Shell keywords (and `!`, `{`) after which the appended path would stand
/// where a command does.
const OPENING_WORDS: &[&str] = &[
    "!", "{", "if", "then", "else", "elif", "while", "until", "do",
];

/// The shell line that runs `command` with the segment's path as its last
/// argument: `command "$@"`, its trailing blanks and newlines dropped (a
/// newline there would make the path a command of its own). A command that
/// still ends where the shell expects a command (`;`, `&`, `|`, `(`, a
/// trailing backslash, a keyword such as `then` or `!`) is refused.
pub(crate) fn shell_line(command: &str) -> Result<String, HookCommandError> {
    let trimmed = command.trim_end_matches(|c: char| c.is_ascii_whitespace());
    if trimmed.trim().is_empty() {
        return Err(HookCommandError::Empty);
    }
    let refuse = |end: &str| HookCommandError::EndsWith {
        command: command.to_string(),
        end: end.to_string(),
    };
    if let Some(c @ (';' | '&' | '|' | '(' | '\\')) = trimmed.chars().last() {
        return Err(refuse(&c.to_string()));
    }
    let last_word = trimmed
        .rsplit(|c: char| c.is_ascii_whitespace() || matches!(c, ';' | '&' | '|' | '('))
        .next()
        .unwrap_or("");
    if OPENING_WORDS.contains(&last_word) {
        return Err(refuse(last_word));
    }
    Ok(format!("{trimmed} \"$@\""))
}

/// One closed segment for the command: its names in the runner's
/// directory and the identity of the files the recorder wrote there.
#[derive(Debug, Clone)]
pub(crate) struct HookJob {
    pub file: String,
    pub(crate) file_id: FileId,
    pub sidecar: String,
    pub(crate) sidecar_id: FileId,
    pub index: u64,
}

/// The command's record so far. Every submitted segment ends in exactly one
/// of: ran (then maybe also failed or timed out), not run (`skipped`), or
/// cut short when the session ended (`stopped`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HookCounts {
    /// Commands that ended on their own or at their timeout.
    pub ran: u64,
    /// Of those, the ones that exited non-zero, were killed, or timed out.
    pub failed: u64,
    /// Of the failed, the ones killed at their timeout.
    #[serde(default)]
    pub(crate) timed_out: u64,
    /// Not run: the queue was full, the session ended first, or the
    /// segment was gone before its turn.
    pub skipped: u64,
    /// Of the not run, the segments whose name was gone (deleted by the
    /// budget) or no longer led to the file written, at their turn.
    #[serde(default)]
    pub gone: u64,
    /// Still running when the session ended and its grace ran out: killed.
    #[serde(default)]
    pub stopped: u64,
    /// Segments the command removed or moved (`$1`): not counted as kept.
    #[serde(default)]
    pub deleted: u64,
}

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    ran: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    skipped: AtomicU64,
    gone: AtomicU64,
    stopped: AtomicU64,
    /// The last failure. Poisoning is harmless here and in `deleted`: each
    /// holder makes one assignment or push, so what it leaves is whole.
    last_error: Mutex<Option<String>>,
    /// Indices of the segments their command deleted or moved.
    deleted: Mutex<Vec<u64>>,
}

/// The thread that runs the command.
pub(crate) struct HookRunner {
    tx: Option<SyncSender<HookJob>>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    dir: OutputDir,
}

impl HookRunner {
    /// Starts the thread for `command` on the segments of `dir`; each run
    /// may last `timeout`. A command [`shell_line`] refuses is an error
    /// (`InvalidInput`).
    pub(crate) fn start(
        command: String,
        timeout: Duration,
        dir: OutputDir,
    ) -> std::io::Result<Self> {
        let line = shell_line(&command)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(MAX_QUEUED);
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("segment-hook".into())
            .spawn({
                let counters = counters.clone();
                let stop = stop.clone();
                let dir = dir.clone();
                move || {
                    let mut r = Run {
                        line,
                        timeout,
                        dir,
                        private: None,
                        c: &counters,
                        stop: &stop,
                        warned_no_links: false,
                    };
                    r.all(&rx);
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            counters,
            thread: Some(thread),
            stop,
            dir,
        })
    }

    /// Queues a closed segment; never blocks.
    pub(crate) fn submit(&self, job: HookJob) {
        let Some(tx) = &self.tx else { return };
        self.counters.queued.fetch_add(1, Ordering::SeqCst);
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                self.counters.queued.fetch_sub(1, Ordering::SeqCst);
                self.counters.skipped.fetch_add(1, Ordering::SeqCst);
                log::warn!(
                    "--on-segment-closed: {} commands already waiting; not run for {}",
                    MAX_QUEUED,
                    self.dir.join(&job.file).display()
                );
            }
        }
    }

    pub(crate) fn counts(&self) -> HookCounts {
        let c = &self.counters;
        HookCounts {
            ran: c.ran.load(Ordering::SeqCst),
            failed: c.failed.load(Ordering::SeqCst),
            timed_out: c.timed_out.load(Ordering::SeqCst),
            skipped: c.skipped.load(Ordering::SeqCst),
            gone: c.gone.load(Ordering::SeqCst),
            stopped: c.stopped.load(Ordering::SeqCst),
            deleted: c
                .deleted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len() as u64,
        }
    }

    /// The indices of the segments their command deleted or moved, so far.
    pub(crate) fn deleted(&self) -> Vec<u64> {
        self.counters
            .deleted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last failure, for the summary.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.counters
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits up to `grace` for the queued commands; then the running one's
    /// group is killed (counted as stopped) and the rest are not run. The
    /// counts returned are final: the thread has ended.
    pub(crate) fn finish(&mut self, grace: Duration) -> HookCounts {
        self.tx = None; // the thread ends once the queue is drained
        let deadline = Instant::now() + grace;
        while self.counters.queued.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.counts()
    }
}

impl Drop for HookRunner {
    fn drop(&mut self) {
        self.tx = None;
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// How one command ended.
enum Outcome {
    Exited(ExitStatus),
    TimedOut,
    Stopped,
}

/// Why a segment's command was not run.
enum NotRun {
    /// Its name is gone (the budget deleted it before its turn).
    Gone,
    /// Its name leads to another file than the one written.
    NotOurs(String),
    /// The links or the descriptor could not be made.
    Failed(std::io::Error),
}

/// What the command is handed for one segment.
struct Staged {
    /// The segment, open for reading: the command's stdin.
    stdin: OwnedFd,
    /// `$1`: the segment's link, or `/dev/stdin`.
    arg: PathBuf,
    /// The sidecar's link.
    sidecar: Option<PathBuf>,
    /// `$1` and the sidecar are links in the runner's directory.
    linked: bool,
}

/// The runner thread's state.
struct Run<'a> {
    line: String,
    timeout: Duration,
    dir: OutputDir,
    /// The runner's own directory, made at the first run.
    private: Option<PrivateDir>,
    c: &'a Counters,
    stop: &'a AtomicBool,
    warned_no_links: bool,
}

impl Run<'_> {
    fn all(&mut self, rx: &Receiver<HookJob>) {
        while let Ok(job) = rx.recv() {
            self.one(&job);
            self.c.queued.fetch_sub(1, Ordering::SeqCst);
        }
        if let Some(p) = self.private.take() {
            p.remove();
        }
    }

    fn one(&mut self, job: &HookJob) {
        let c = self.c;
        let shown = self.dir.join(&job.file);
        if self.stop.load(Ordering::SeqCst) {
            c.skipped.fetch_add(1, Ordering::SeqCst);
            return;
        }
        let staged = match self.stage(job) {
            Ok(s) => s,
            Err(NotRun::Gone) => {
                c.skipped.fetch_add(1, Ordering::SeqCst);
                c.gone.fetch_add(1, Ordering::SeqCst);
                log::warn!(
                    "--on-segment-closed: {} was deleted before its turn: not run",
                    shown.display()
                );
                return;
            }
            Err(NotRun::NotOurs(why)) => {
                c.skipped.fetch_add(1, Ordering::SeqCst);
                c.gone.fetch_add(1, Ordering::SeqCst);
                log::warn!("--on-segment-closed: {} {why}: not run", shown.display());
                return;
            }
            Err(NotRun::Failed(e)) => {
                c.ran.fetch_add(1, Ordering::SeqCst);
                self.failed(&shown, format!("could not start: {e}"));
                return;
            }
        };
        let linked = staged.linked;
        let failure = match run_one(&self.line, job, staged, self.timeout, self.stop) {
            Err(e) => {
                c.ran.fetch_add(1, Ordering::SeqCst);
                Some(format!("could not start: {e}"))
            }
            Ok((Outcome::Stopped, _)) => {
                c.stopped.fetch_add(1, Ordering::SeqCst);
                log::warn!(
                    "--on-segment-closed for {}: still running when the session ended; killed",
                    shown.display()
                );
                None
            }
            Ok((outcome, tail)) => {
                c.ran.fetch_add(1, Ordering::SeqCst);
                let why = match outcome {
                    Outcome::Exited(s) if s.success() => None,
                    Outcome::Exited(s) => Some(format!("exited with {s}")),
                    Outcome::TimedOut => {
                        c.timed_out.fetch_add(1, Ordering::SeqCst);
                        Some(format!(
                            "still running after {}; its process group was killed",
                            humantime::format_duration(self.timeout)
                        ))
                    }
                    Outcome::Stopped => None,
                };
                why.map(|w| {
                    let last = last_lines(&tail);
                    if last.is_empty() {
                        w
                    } else {
                        format!("{w}: {last}")
                    }
                })
            }
        };
        if let Some(why) = failure {
            self.failed(&shown, why);
        }
        if self.removed_by_command(job, linked) {
            c.deleted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(job.index);
        }
        if let Some(p) = &self.private {
            p.unlink(&job.file);
            p.unlink(&job.sidecar);
        }
    }

    fn failed(&self, shown: &std::path::Path, why: String) {
        self.c.failed.fetch_add(1, Ordering::SeqCst);
        let msg = format!("--on-segment-closed for {}: {why}", shown.display());
        log::warn!("{msg}");
        *self
            .c
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(msg);
    }

    /// Whether the command removed or moved the segment: its link is gone
    /// (then its name in the directory goes too, while it is still the
    /// file written); without links, whether the name is gone.
    fn removed_by_command(&self, job: &HookJob, linked: bool) -> bool {
        match (&self.private, linked) {
            (Some(p), true) => {
                if p.holds(&job.file, job.file_id) {
                    return false;
                }
                if let Err(e) = self.dir.remove_if(&job.file, job.file_id) {
                    log::warn!(
                        "--on-segment-closed: {}: {e}",
                        self.dir.join(&job.file).display()
                    );
                }
                true
            }
            _ => !self.dir.holds(&job.file, job.file_id),
        }
    }

    /// The segment and its sidecar, linked into the runner's directory and
    /// checked to be the files written; without hard links, the segment's
    /// descriptor alone.
    fn stage(&mut self, job: &HookJob) -> Result<Staged, NotRun> {
        if !self.dir.path_leads_here() {
            return Err(NotRun::NotOurs(format!(
                "is no longer reached through {}",
                self.dir.path().display()
            )));
        }
        if self.private.is_none() {
            self.private = Some(
                self.dir
                    .make_private_dir(PRIVATE_DIR)
                    .map_err(NotRun::Failed)?,
            );
        }
        let Some(p) = &self.private else {
            return Err(NotRun::Failed(std::io::ErrorKind::NotFound.into()));
        };
        match p.link_from(&self.dir, &job.file) {
            Ok(()) => {}
            Err(rustix::io::Errno::NOENT) => return Err(NotRun::Gone),
            Err(e) => {
                // A file system without hard links: the descriptor alone.
                if !self.warned_no_links {
                    self.warned_no_links = true;
                    log::warn!(
                        "--on-segment-closed: cannot link segments in {} ({e}): commands get the segment on stdin only ($1 is /dev/stdin)",
                        self.dir.path().display()
                    );
                }
                let stdin = match self.dir.open_if(&job.file, job.file_id) {
                    Ok(Some(fd)) => fd,
                    Ok(None) => return Err(self.gone_or_not_ours(&job.file)),
                    Err(e) => return Err(NotRun::Failed(e)),
                };
                return Ok(Staged {
                    stdin,
                    arg: PathBuf::from("/dev/stdin"),
                    sidecar: None,
                    linked: false,
                });
            }
        }
        let not_ours = |what: &str| {
            p.unlink(&job.file);
            p.unlink(&job.sidecar);
            NotRun::NotOurs(format!("{what} no longer the file the recorder wrote"))
        };
        let stdin = match p.open_if(&job.file, job.file_id) {
            Ok(Some(fd)) => fd,
            Ok(None) => return Err(not_ours("is")),
            Err(e) => return Err(NotRun::Failed(e)),
        };
        match p.link_from(&self.dir, &job.sidecar) {
            Ok(()) if p.holds(&job.sidecar, job.sidecar_id) => {}
            Ok(()) => return Err(not_ours("its sidecar is")),
            Err(rustix::io::Errno::NOENT) => {
                p.unlink(&job.file);
                return Err(NotRun::Gone);
            }
            Err(e) => {
                p.unlink(&job.file);
                return Err(NotRun::Failed(e.into()));
            }
        }
        Ok(Staged {
            stdin,
            arg: p.path().join(&job.file),
            sidecar: Some(p.path().join(&job.sidecar)),
            linked: true,
        })
    }

    fn gone_or_not_ours(&self, name: &str) -> NotRun {
        if self.dir.has(name) {
            NotRun::NotOurs("is no longer the file the recorder wrote".into())
        } else {
            NotRun::Gone
        }
    }
}

/// Runs the command for `job` in a process group of its own, draining its
/// output into a bounded tail, until the shell exits, `timeout` passes, or
/// `stop` is set (then the group is killed).
fn run_one(
    line: &str,
    job: &HookJob,
    staged: Staged,
    timeout: Duration,
    stop: &AtomicBool,
) -> std::io::Result<(Outcome, VecDeque<u8>)> {
    let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    rustix::io::ioctl_fionbio(&out_r, true)?;
    // The segment was opened without blocking; the command reads it plainly.
    rustix::io::ioctl_fionbio(&staged.stdin, false)?;
    let mut child = {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(line)
            .arg("sh")
            .arg(&staged.arg)
            .env("RECORDER_SEGMENT_NAME", &job.file)
            .env("RECORDER_SEGMENT_INDEX", job.index.to_string())
            .stdin(Stdio::from(staged.stdin))
            .stdout(Stdio::from(out_w.try_clone()?))
            .stderr(Stdio::from(out_w))
            .process_group(0);
        match &staged.sidecar {
            Some(car) => cmd.env("RECORDER_SEGMENT_SIDECAR", car),
            None => cmd.env_remove("RECORDER_SEGMENT_SIDECAR"),
        };
        cmd.spawn()?
        // `cmd` (and with it our copies of the pipe's write end and of the
        // segment) drops here: the pipe ends when the command's processes
        // close it.
    };
    let pid = Pid::from_child(&child);
    let pidfd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(e) => {
            end_group(&mut child, pid);
            return Err(e.into());
        }
    };
    let deadline = Instant::now() + timeout;
    let mut tail = VecDeque::with_capacity(OUTPUT_TAIL);
    let mut out = Some(out_r);
    loop {
        if stop.load(Ordering::SeqCst) {
            end_group(&mut child, pid);
            return Ok((Outcome::Stopped, tail));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            end_group(&mut child, pid);
            return Ok((Outcome::TimedOut, tail));
        }
        wait_readable(out.as_ref(), &pidfd, left.min(TICK));
        if let Some(fd) = &out
            && !drain(fd, &mut tail)
        {
            out = None;
        }
        if let Some(status) = child.try_wait()? {
            if let Some(fd) = &out {
                drain(fd, &mut tail);
            }
            // Whatever the command left running keeps the pipe, if it
            // wants it; nobody reads it any more.
            return Ok((Outcome::Exited(status), tail));
        }
    }
}

/// Polls the output pipe (while open) and the pidfd for up to `wait`.
fn wait_readable(out: Option<&OwnedFd>, pidfd: &OwnedFd, wait: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: wait.as_secs() as i64,
        tv_nsec: i64::from(wait.subsec_nanos()),
    };
    let mut fds = vec![PollFd::new(pidfd, PollFlags::IN)];
    if let Some(fd) = out {
        fds.push(PollFd::new(fd, PollFlags::IN));
    }
    let _ = rustix::event::poll(&mut fds, Some(&ts));
}

/// Reads what the pipe holds now (at most 1 MiB, so a command writing
/// without pause still lets the loop see its deadline), keeping the last
/// OUTPUT_TAIL bytes; false once the pipe has ended.
fn drain(fd: impl AsFd, tail: &mut VecDeque<u8>) -> bool {
    let mut buf = [0u8; 64 * 1024];
    for _ in 0..16 {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) => return false,
            Ok(n) => {
                let keep = &buf[n.saturating_sub(OUTPUT_TAIL)..n];
                let excess = (tail.len() + keep.len()).saturating_sub(OUTPUT_TAIL);
                tail.drain(..excess.min(tail.len()));
                tail.extend(keep);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => return true,
            Err(_) => return false,
        }
    }
    true
}

/// Kills the command's whole process group and reaps the shell.
fn end_group(child: &mut Child, pid: Pid) {
    let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    let _ = child.wait();
}

/// The last TAIL_LINES non-empty lines of `tail`, joined with " | ", with
/// control characters escaped (it goes to a terminal).
fn last_lines(tail: &VecDeque<u8>) -> String {
    let bytes: Vec<u8> = tail.iter().copied().collect();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    lines[from..]
        .iter()
        .map(|l| l.escape_debug().to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn id_of(p: &std::path::Path) -> FileId {
        let m = std::fs::symlink_metadata(p).expect("meta");
        (m.dev(), m.ino())
    }

    /// Segment `i` and its sidecar, written in `dir`, as a job.
    fn job(dir: &std::path::Path, i: u64) -> HookJob {
        let file = format!("seg-{i}");
        let sidecar = format!("seg-{i}.json");
        std::fs::write(dir.join(&file), format!("segment {i}\n")).expect("write");
        std::fs::write(dir.join(&sidecar), format!("{{\"index\": {i}}}\n")).expect("write");
        HookJob {
            file_id: id_of(&dir.join(&file)),
            sidecar_id: id_of(&dir.join(&sidecar)),
            file,
            sidecar,
            index: i,
        }
    }

    fn runner(dir: &std::path::Path, cmd: &str, timeout: Duration) -> HookRunner {
        let od = OutputDir::open(dir).expect("dir");
        HookRunner::start(cmd.into(), timeout, od).expect("starts")
    }

    #[test]
    fn runs_in_order_with_a_link_to_the_segment_and_counts_failures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        let cmd = format!(
            "f() {{ echo \"$(basename \"$(dirname \"$1\")\") $(basename \"$1\") $RECORDER_SEGMENT_NAME $RECORDER_SEGMENT_INDEX $(cat) $(cat \"$RECORDER_SEGMENT_SIDECAR\")\" >> {}; case $1 in *seg-1) return 3;; esac; }}; f",
            log.display()
        );
        let mut r = runner(dir.path(), &cmd, DEFAULT_TIMEOUT);
        for i in 0..3 {
            r.submit(job(dir.path(), i));
        }
        let c = r.finish(Duration::from_secs(10));
        assert_eq!((c.ran, c.failed, c.skipped), (3, 1, 0));
        let text = std::fs::read_to_string(&log).expect("log");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        for (i, l) in lines.iter().enumerate() {
            let w: Vec<&str> = l.split(' ').collect();
            assert!(w[0].starts_with(".recorder-hook."), "{l}");
            assert_eq!(
                &w[1..],
                &[
                    &format!("seg-{i}")[..],
                    &format!("seg-{i}"),
                    &i.to_string(),
                    "segment",
                    &i.to_string(),
                    "{\"index\":",
                    &format!("{i}}}"),
                ],
                "{l}"
            );
        }
        assert!(r.last_error().is_some_and(|e| e.contains("seg-1")));
        // The links and their directory are gone; the segments stay.
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(dir.path().join("seg-1").is_file());
    }

    #[test]
    fn a_segment_deleted_or_replaced_before_its_turn_is_not_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "secret\n").expect("secret");
        let copies = dir.path().join("copies");
        let cmd = format!("f() {{ cat \"$1\" >> {}; }}; f", copies.display());
        let gone = job(dir.path(), 0);
        std::fs::remove_file(dir.path().join(&gone.file)).expect("rm");
        let planted = job(dir.path(), 1);
        std::fs::remove_file(dir.path().join(&planted.file)).expect("rm");
        std::os::unix::fs::symlink(&secret, dir.path().join(&planted.file)).expect("ln");
        let copied = job(dir.path(), 2);
        std::fs::write(dir.path().join("other"), "another file\n").expect("write");
        std::fs::rename(dir.path().join("other"), dir.path().join(&copied.file)).expect("mv");
        let fine = job(dir.path(), 3);
        let mut r = runner(dir.path(), &cmd, DEFAULT_TIMEOUT);
        for j in [gone, planted, copied, fine] {
            r.submit(j);
        }
        let c = r.finish(Duration::from_secs(10));
        assert_eq!((c.ran, c.skipped, c.gone, c.failed), (1, 3, 3, 0), "{c:?}");
        assert_eq!(
            std::fs::read_to_string(&copies).expect("copies"),
            "segment 3\n"
        );
    }

    #[test]
    fn the_command_reads_the_file_written_even_when_its_name_is_replaced_meanwhile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "secret\n").expect("secret");
        let (started, go, out) = (
            dir.path().join("started"),
            dir.path().join("go"),
            dir.path().join("out"),
        );
        let cmd = format!(
            "f() {{ : > {s}; i=0; while [ ! -e {g} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; cat \"$1\" \"$RECORDER_SEGMENT_SIDECAR\" - > {o}; }}; f",
            s = started.display(),
            g = go.display(),
            o = out.display()
        );
        let j = job(dir.path(), 0);
        let mut r = runner(dir.path(), &cmd, DEFAULT_TIMEOUT);
        r.submit(j.clone());
        let t0 = Instant::now();
        while !started.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Deleted (by a budget, say) and a link to a secret planted in its
        // place, while the command runs.
        for name in [&j.file, &j.sidecar] {
            std::fs::remove_file(dir.path().join(name)).expect("rm");
            std::os::unix::fs::symlink(&secret, dir.path().join(name)).expect("ln");
        }
        std::fs::write(&go, "").expect("go");
        let c = r.finish(Duration::from_secs(20));
        assert_eq!((c.ran, c.failed, c.deleted), (1, 0, 0), "{c:?}");
        assert_eq!(
            std::fs::read_to_string(&out).expect("out"),
            "segment 0\n{\"index\": 0}\nsegment 0\n"
        );
    }

    #[test]
    fn commands_that_would_run_the_path_are_refused() {
        assert_eq!(
            shell_line("rclone copy\n\n").expect("fine"),
            "rclone copy \"$@\""
        );
        assert_eq!(
            shell_line("f() { cp \"$1\" /x; }; f").expect("fine"),
            "f() { cp \"$1\" /x; }; f \"$@\""
        );
        shell_line("a\nb").expect("a newline inside is fine");
        for bad in [
            "cp x y;",
            "cp x y &",
            "cp x y |",
            "a &&",
            "a ||\n",
            "true; !",
            "if true; then",
            "while :; do",
            "(",
            "f() {",
            "cmd \\",
        ] {
            assert!(
                matches!(shell_line(bad), Err(HookCommandError::EndsWith { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(shell_line(" \n"), Err(HookCommandError::Empty));
        assert!(shell_line("echo !x").is_ok());
    }

    #[test]
    fn a_slow_command_never_blocks_submit_or_finish_and_every_segment_is_counted_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = runner(dir.path(), "sleep 5; true", DEFAULT_TIMEOUT);
        let t = Instant::now();
        let submitted = MAX_QUEUED as u64 + 10;
        let one = job(dir.path(), 0);
        for i in 0..submitted {
            r.submit(HookJob {
                index: i,
                ..one.clone()
            });
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let c = r.finish(Duration::from_millis(50));
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert_eq!((c.ran, c.stopped, c.failed), (0, 1, 0), "{c:?}");
        assert_eq!(c.skipped, submitted - 1, "{c:?}");
    }

    /// Pids written by the commands into `file`, one a line.
    fn pids(file: &std::path::Path) -> Vec<i32> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    fn alive(pid: i32) -> bool {
        let Some(pid) = Pid::from_raw(pid) else {
            return false;
        };
        // A zombie has no more threads to run; count it as gone.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    #[test]
    fn a_background_child_holding_the_output_does_not_hold_up_the_runner() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("pids");
        let cmd = format!("f() {{ (sleep 300 & echo $! >> {}); }}; f", file.display());
        let mut r = runner(dir.path(), &cmd, DEFAULT_TIMEOUT);
        let t = Instant::now();
        for i in 0..3 {
            r.submit(job(dir.path(), i));
        }
        let c = r.finish(Duration::from_secs(20));
        let took = t.elapsed();
        let left = pids(&file);
        for &p in &left {
            if let Some(p) = Pid::from_raw(p) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert_eq!(
            (c.ran, c.failed, c.skipped, c.stopped),
            (3, 0, 0, 0),
            "{c:?}"
        );
        assert_eq!(left.len(), 3);
    }

    #[test]
    fn a_command_past_its_timeout_has_its_whole_group_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("pids");
        let cmd = format!(
            "echo first words; sleep 300 & echo $! >> {}; echo last words >&2; wait; true",
            file.display()
        );
        let mut r = runner(dir.path(), &cmd, Duration::from_millis(300));
        let t = Instant::now();
        r.submit(job(dir.path(), 0));
        r.submit(job(dir.path(), 1));
        let c = r.finish(Duration::from_secs(20));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(
            (c.ran, c.failed, c.timed_out, c.skipped),
            (2, 2, 2, 0),
            "{c:?}"
        );
        let left = pids(&file);
        assert_eq!(left.len(), 2);
        std::thread::sleep(Duration::from_millis(100));
        assert!(left.iter().all(|&p| !alive(p)), "{left:?} still running");
        let e = r.last_error().expect("an error");
        assert!(e.contains("still running after 300ms"), "{e}");
        assert!(e.contains("first words | last words"), "{e}");
    }

    #[test]
    fn output_is_kept_as_a_bounded_tail_escaped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cmd = "head -c 50000000 /dev/zero; printf 'x\\033[2Jy\\n' >&2; exit 4";
        let mut r = runner(dir.path(), cmd, DEFAULT_TIMEOUT);
        r.submit(job(dir.path(), 0));
        let c = r.finish(Duration::from_secs(20));
        assert_eq!((c.ran, c.failed), (1, 1));
        let e = r.last_error().expect("an error");
        assert!(e.len() < OUTPUT_TAIL * 7, "{}", e.len());
        assert!(e.contains("x\\u{1b}[2Jy"), "{e:?}");
        assert!(!e.contains('\x1b'), "{e:?}");
    }

    #[test]
    fn segments_the_command_removes_are_counted_as_deleted_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cmd = "f() { case $1 in *seg-1) ;; *) rm \"$1\";; esac; }; f";
        let mut r = runner(dir.path(), cmd, DEFAULT_TIMEOUT);
        for i in 0..3 {
            r.submit(job(dir.path(), i));
        }
        let c = r.finish(Duration::from_secs(20));
        assert_eq!((c.ran, c.deleted), (3, 2), "{c:?}");
        let mut d = r.deleted();
        d.sort_unstable();
        assert_eq!(d, vec![0, 2]);
        assert!(!dir.path().join("seg-0").exists());
        assert!(dir.path().join("seg-1").exists());
        assert!(!dir.path().join("seg-2").exists());
    }
}

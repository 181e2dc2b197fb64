//! `--on-segment-closed CMD`: runs a shell command for each closed segment on
//! a thread of its own, so a slow or failing command never holds up
//! recording. Commands run one at a time, in segment order; the segment's
//! path is the command's last argument (`sh -c 'CMD "$@"' sh PATH`), and
//! `RECORDER_SEGMENT_SIDECAR` / `RECORDER_SEGMENT_INDEX` name its sidecar and
//! index. Failures are logged (with the last lines of the command's output)
//! and counted, never retried.
//!
//! Each command runs in a process group of its own with stdin from
//! /dev/null and stdout and stderr into one pipe that the runner drains
//! into a bounded tail ([`OUTPUT_TAIL`] bytes: a command that writes
//! gigabytes costs reads, not memory). The runner waits for the shell
//! itself (a pidfd), never for the pipe's end: a background child that
//! keeps the pipe open does not hold up the next segment. A command still
//! running after its timeout has its whole group killed, and so has one
//! still running when the session ends after its grace period.
//!
//! At most [`MAX_QUEUED`] closed segments wait for their command; past that
//! the newest are not run (counted and logged), so a stuck command cannot
//! grow memory without bound.
//!
//! The interface is small on purpose (start, submit, counts, finish): the
//! runner may live in another process than the writer.

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

/// Closed segments waiting for their command, at most.
pub const MAX_QUEUED: usize = 1024;
/// How long one command may run before its process group is killed, unless
/// `--hook-timeout` (or `hook_timeout` in NAME.segments.toml) says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes of a command's output kept (its last lines), for the log.
pub const OUTPUT_TAIL: usize = 4096;
/// Lines of that tail quoted in a failure's message.
const TAIL_LINES: usize = 5;
/// How often the runner looks at the stop flag while a command runs.
const TICK: Duration = Duration::from_millis(50);

/// One closed segment for the command.
#[derive(Debug, Clone)]
pub struct HookJob {
    pub path: PathBuf,
    pub sidecar: PathBuf,
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
    pub timed_out: u64,
    /// Not run: the queue was full, or the session ended first.
    pub skipped: u64,
    /// Still running when the session ended and its grace ran out: killed.
    #[serde(default)]
    pub stopped: u64,
    /// Segments gone from their path after their command (deleted or moved
    /// by it): not counted as kept.
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
    stopped: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Indices of the segments their command deleted or moved.
    deleted: Mutex<Vec<u64>>,
}

/// The thread that runs the command.
pub struct HookRunner {
    tx: Option<SyncSender<HookJob>>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl HookRunner {
    /// Starts the thread for `command`; each run may last `timeout`.
    pub fn start(command: String, timeout: Duration) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(MAX_QUEUED);
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("segment-hook".into())
            .spawn({
                let counters = counters.clone();
                let stop = stop.clone();
                move || run(&command, timeout, &rx, &counters, &stop)
            })?;
        Ok(Self {
            tx: Some(tx),
            counters,
            thread: Some(thread),
            stop,
        })
    }

    /// Queues a closed segment; never blocks.
    pub fn submit(&self, job: HookJob) {
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
                    job.path.display()
                );
            }
        }
    }

    pub fn counts(&self) -> HookCounts {
        let c = &self.counters;
        HookCounts {
            ran: c.ran.load(Ordering::SeqCst),
            failed: c.failed.load(Ordering::SeqCst),
            timed_out: c.timed_out.load(Ordering::SeqCst),
            skipped: c.skipped.load(Ordering::SeqCst),
            stopped: c.stopped.load(Ordering::SeqCst),
            deleted: c
                .deleted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len() as u64,
        }
    }

    /// The indices of the segments their command deleted or moved, so far.
    pub fn deleted(&self) -> Vec<u64> {
        self.counters
            .deleted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last failure, for the summary.
    pub fn last_error(&self) -> Option<String> {
        self.counters
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits up to `grace` for the queued commands; then the running one's
    /// group is killed (counted as stopped) and the rest are not run. The
    /// counts returned are final: the thread has ended.
    pub fn finish(&mut self, grace: Duration) -> HookCounts {
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

fn run(command: &str, timeout: Duration, rx: &Receiver<HookJob>, c: &Counters, stop: &AtomicBool) {
    while let Ok(job) = rx.recv() {
        if stop.load(Ordering::SeqCst) {
            c.skipped.fetch_add(1, Ordering::SeqCst);
            c.queued.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let failure = match run_one(command, &job, timeout, stop) {
            Err(e) => {
                c.ran.fetch_add(1, Ordering::SeqCst);
                Some(format!("could not start: {e}"))
            }
            Ok((Outcome::Stopped, _)) => {
                c.stopped.fetch_add(1, Ordering::SeqCst);
                log::warn!(
                    "--on-segment-closed for {}: still running when the session ended; killed",
                    job.path.display()
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
                            humantime::format_duration(timeout)
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
            c.failed.fetch_add(1, Ordering::SeqCst);
            let msg = format!("--on-segment-closed for {}: {why}", job.path.display());
            log::warn!("{msg}");
            *c.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(msg);
        }
        if std::fs::symlink_metadata(&job.path)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            c.deleted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(job.index);
        }
        c.queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs the command for `job` in a process group of its own, draining its
/// output into a bounded tail, until the shell exits, `timeout` passes, or
/// `stop` is set (then the group is killed).
fn run_one(
    command: &str,
    job: &HookJob,
    timeout: Duration,
    stop: &AtomicBool,
) -> std::io::Result<(Outcome, VecDeque<u8>)> {
    let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    rustix::io::ioctl_fionbio(&out_r, true)?;
    let mut child = {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("{command} \"$@\""))
            .arg("sh")
            .arg(&job.path)
            .env("RECORDER_SEGMENT_SIDECAR", &job.sidecar)
            .env("RECORDER_SEGMENT_INDEX", job.index.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out_w.try_clone()?))
            .stderr(Stdio::from(out_w))
            .process_group(0);
        cmd.spawn()?
        // `cmd` (and with it our copies of the pipe's write end) drops here:
        // the pipe ends when the command's processes close it.
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

    fn job(dir: &std::path::Path, i: u64) -> HookJob {
        HookJob {
            path: dir.join(format!("seg-{i}")),
            sidecar: dir.join(format!("seg-{i}.json")),
            index: i,
        }
    }

    #[test]
    fn runs_in_order_with_the_path_and_counts_failures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        let cmd = format!(
            "f() {{ echo \"$1 $RECORDER_SEGMENT_INDEX\" >> {}; case $1 in *seg-1) return 3;; esac; }}; f",
            log.display()
        );
        let mut r = HookRunner::start(cmd, DEFAULT_TIMEOUT).expect("starts");
        for i in 0..3 {
            r.submit(job(dir.path(), i));
        }
        let c = r.finish(Duration::from_secs(10));
        assert_eq!((c.ran, c.failed, c.skipped), (3, 1, 0));
        let text = std::fs::read_to_string(&log).expect("log");
        let d = dir.path().display();
        assert_eq!(text, format!("{d}/seg-0 0\n{d}/seg-1 1\n{d}/seg-2 2\n"));
        assert!(r.last_error().is_some_and(|e| e.contains("seg-1")));
    }

    #[test]
    fn a_slow_command_never_blocks_submit_or_finish_and_every_segment_is_counted_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = HookRunner::start("sleep 5; true".into(), DEFAULT_TIMEOUT).expect("starts");
        let t = Instant::now();
        let submitted = MAX_QUEUED as u64 + 10;
        for i in 0..submitted {
            r.submit(job(dir.path(), i));
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
        let mut r = HookRunner::start(cmd, DEFAULT_TIMEOUT).expect("starts");
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
        let mut r = HookRunner::start(cmd, Duration::from_millis(300)).expect("starts");
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
        let mut r = HookRunner::start(cmd.into(), DEFAULT_TIMEOUT).expect("starts");
        r.submit(job(dir.path(), 0));
        let c = r.finish(Duration::from_secs(20));
        assert_eq!((c.ran, c.failed), (1, 1));
        let e = r.last_error().expect("an error");
        assert!(e.len() < OUTPUT_TAIL * 7, "{}", e.len());
        assert!(e.contains("x\\u{1b}[2Jy"), "{e:?}");
        assert!(!e.contains('\x1b'), "{e:?}");
    }

    #[test]
    fn segments_the_command_removes_are_counted_as_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        for i in 0..3 {
            std::fs::write(job(dir.path(), i).path, b"x").expect("write");
        }
        let cmd = "f() { case $1 in *seg-1) ;; *) rm \"$1\";; esac; }; f";
        let mut r = HookRunner::start(cmd.into(), DEFAULT_TIMEOUT).expect("starts");
        for i in 0..3 {
            r.submit(job(dir.path(), i));
        }
        let c = r.finish(Duration::from_secs(20));
        assert_eq!((c.ran, c.deleted), (3, 2), "{c:?}");
        let mut d = r.deleted();
        d.sort_unstable();
        assert_eq!(d, vec![0, 2]);
    }
}

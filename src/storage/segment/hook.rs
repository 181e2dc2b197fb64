//! `--on-segment-closed CMD`: runs a shell command for each closed segment on
//! a thread of its own, so a slow or failing command never holds up
//! recording. Commands run one at a time, in segment order; the segment's
//! path is the command's last argument (`sh -c 'CMD "$@"' sh PATH`), and
//! `RECORDER_SEGMENT_SIDECAR` / `RECORDER_SEGMENT_INDEX` name its sidecar and
//! index. Failures are logged (with the command's last line of stderr) and
//! counted, never retried. The command's output never reaches the
//! recorder's own stdout and stderr, so a command that outlives the session
//! holds none of its pipes open.
//!
//! At most [`MAX_QUEUED`] closed segments wait for their command; past that
//! the newest are skipped (counted and logged), so a stuck command cannot
//! grow memory without bound.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Closed segments waiting for their command, at most.
pub const MAX_QUEUED: usize = 1024;

/// One closed segment for the command.
#[derive(Debug, Clone)]
pub struct HookJob {
    pub path: PathBuf,
    pub sidecar: PathBuf,
    pub index: u64,
}

/// The command's record so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HookCounts {
    pub ran: u64,
    pub failed: u64,
    /// Not run: the queue was full, or the session ended first.
    pub skipped: u64,
}

#[derive(Default)]
struct Counters {
    queued: AtomicU64,
    ran: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// The thread that runs the command.
pub struct HookRunner {
    tx: Option<SyncSender<HookJob>>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl HookRunner {
    /// Starts the thread for `command`.
    pub fn start(command: String) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(MAX_QUEUED);
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("segment-hook".into())
            .spawn({
                let counters = counters.clone();
                let stop = stop.clone();
                move || run(&command, &rx, &counters, &stop)
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
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                self.counters.queued.fetch_sub(1, Ordering::Relaxed);
                self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "--on-segment-closed: {} commands already waiting; not run for {}",
                    MAX_QUEUED,
                    job.path.display()
                );
            }
        }
    }

    pub fn counts(&self) -> HookCounts {
        HookCounts {
            ran: self.counters.ran.load(Ordering::Relaxed),
            failed: self.counters.failed.load(Ordering::Relaxed),
            skipped: self.counters.skipped.load(Ordering::Relaxed),
        }
    }

    /// The last failure, for the summary.
    pub fn last_error(&self) -> Option<String> {
        self.counters
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits up to `grace` for the queued commands, then lets the running one
    /// go on unwatched and skips the rest. Returns the final counts.
    pub fn finish(&mut self, grace: Duration) -> HookCounts {
        self.tx = None; // the thread ends once the queue is drained
        let deadline = Instant::now() + grace;
        while self.counters.queued.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::Relaxed);
        if self.counters.queued.load(Ordering::Relaxed) == 0
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
        // A thread still inside a slow command is left to finish on its own:
        // the session does not wait for it.
        self.counts()
    }
}

impl Drop for HookRunner {
    fn drop(&mut self) {
        self.tx = None;
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn run(command: &str, rx: &Receiver<HookJob>, c: &Counters, stop: &std::sync::atomic::AtomicBool) {
    while let Ok(job) = rx.recv() {
        if stop.load(Ordering::Relaxed) {
            c.skipped.fetch_add(1, Ordering::Relaxed);
            c.queued.fetch_sub(1, Ordering::Relaxed);
            continue;
        }
        let outcome = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("{command} \"$@\""))
            .arg("sh")
            .arg(&job.path)
            .env("RECORDER_SEGMENT_SIDECAR", &job.sidecar)
            .env("RECORDER_SEGMENT_INDEX", job.index.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        let failure = match outcome {
            Ok(o) if o.status.success() => None,
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stderr);
                let last = text.lines().last().unwrap_or("").trim();
                Some(if last.is_empty() {
                    format!("exited with {}", o.status)
                } else {
                    format!("exited with {}: {last}", o.status)
                })
            }
            Err(e) => Some(format!("could not start: {e}")),
        };
        match failure {
            None => {
                c.ran.fetch_add(1, Ordering::Relaxed);
            }
            Some(why) => {
                c.ran.fetch_add(1, Ordering::Relaxed);
                c.failed.fetch_add(1, Ordering::Relaxed);
                let msg = format!("--on-segment-closed for {}: {why}", job.path.display());
                log::warn!("{msg}");
                *c.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(msg);
            }
        }
        c.queued.fetch_sub(1, Ordering::Relaxed);
    }
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
        let mut r = HookRunner::start(cmd).expect("starts");
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
    fn a_slow_command_never_blocks_submit_or_finish_for_long() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = HookRunner::start("sleep 5; true".into()).expect("starts");
        let t = Instant::now();
        for i in 0..(MAX_QUEUED as u64 + 10) {
            r.submit(job(dir.path(), i));
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let c = r.finish(Duration::from_millis(50));
        assert!(c.skipped >= 9, "{c:?}");
        assert_eq!(c.failed, 0);
    }
}

//! The loop's one blocking wait: `poll(2)` on the descriptors that bring
//! events (signals, the control server, …) with the nearest timer as the
//! timeout. Timers are the session's, keyed by [`Timer`], in time since the
//! session's origin.

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::time::Timespec;

use crate::session::Timer;

/// Timers and the wait.
#[derive(Debug)]
pub struct Reactor {
    origin: Instant,
    timers: BTreeMap<Timer, Duration>,
}

impl Reactor {
    /// A reactor whose time origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            timers: BTreeMap::new(),
        }
    }

    /// Time since the origin.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Sets (or moves) `timer` to fire at `at` since the origin.
    pub fn set(&mut self, timer: Timer, at: Duration) {
        self.timers.insert(timer, at);
    }

    pub fn cancel(&mut self, timer: Timer) {
        self.timers.remove(&timer);
    }

    /// Removes and returns the timers that are due, earliest first.
    pub fn due(&mut self) -> Vec<Timer> {
        let now = self.now();
        let mut due: Vec<(Duration, Timer)> = self
            .timers
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(t, at)| (*at, *t))
            .collect();
        due.sort();
        for (_, t) in &due {
            self.timers.remove(t);
        }
        due.into_iter().map(|(_, t)| t).collect()
    }

    /// Blocks until one of `fds` is readable, the nearest timer is due, or
    /// `at_most` has passed; returns which of `fds` are readable.
    pub fn wait(&self, fds: &[BorrowedFd<'_>], at_most: Duration) -> Vec<bool> {
        let now = self.now();
        let mut timeout = at_most;
        if let Some(next) = self.timers.values().min() {
            timeout = timeout.min(next.saturating_sub(now));
        }
        let ts = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        let mut pfds: Vec<PollFd<'_>> = fds
            .iter()
            .map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
            .collect();
        if pfds.is_empty() {
            std::thread::sleep(timeout);
            return Vec::new();
        }
        // EINTR (a signal) is a wake-up like any other.
        let _ = poll(&mut pfds, Some(&ts));
        pfds.iter().map(|p| !p.revents().is_empty()).collect()
    }
}

impl Default for Reactor {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_timers_come_out_earliest_first_and_once() {
        let mut r = Reactor::new();
        r.set(Timer::Stats, Duration::ZERO);
        r.set(Timer::WritePass, Duration::from_nanos(1));
        r.set(Timer::Stop, Duration::from_secs(3600));
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(r.due(), vec![Timer::Stats, Timer::WritePass]);
        assert!(r.due().is_empty());
        r.cancel(Timer::Stop);
        // Nothing left: the wait is bounded by `at_most` alone.
        let t = Instant::now();
        r.wait(&[], Duration::from_millis(5));
        assert!(t.elapsed() >= Duration::from_millis(5));
    }

    #[test]
    fn a_readable_descriptor_ends_the_wait() {
        let r = Reactor::new();
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        std::io::Write::write_all(&mut &b, b"x").expect("write");
        use std::os::fd::AsFd;
        let ready = r.wait(&[a.as_fd()], Duration::from_secs(60));
        assert_eq!(ready, vec![true]);
    }
}

//! Time for the loop: a session's [`Timers`], keyed by [`Timer`] in time
//! since the session's origin, and the one blocking [`wait_for`] of a host:
//! `poll(2)` on the descriptors that bring events with the nearest
//! deadline as the timeout.

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::time::Timespec;

use crate::session::Timer;

/// One session's timers.
#[derive(Debug)]
pub(crate) struct Timers {
    origin: Instant,
    timers: BTreeMap<Timer, Duration>,
}

impl Timers {
    /// Timers whose time origin is now.
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
            timers: BTreeMap::new(),
        }
    }

    /// Time since the origin.
    pub(crate) fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Sets (or moves) `timer` to fire at `at` since the origin.
    pub(crate) fn set(&mut self, timer: Timer, at: Duration) {
        self.timers.insert(timer, at);
    }

    pub(crate) fn cancel(&mut self, timer: Timer) {
        self.timers.remove(&timer);
    }

    /// When the nearest timer is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.timers.values().min().map(|at| self.origin + *at)
    }

    /// Removes and returns the timers that are due, earliest first.
    pub(crate) fn due(&mut self) -> Vec<Timer> {
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
}

impl Default for Timers {
    fn default() -> Self {
        Self::new()
    }
}

/// Blocks until one of `fds` is ready for its interest (readable,
/// writable) or `deadline` (none: no limit) has come; returns what each one
/// is ready for (with `HUP` and `ERR`). A signal (EINTR) is a wake-up like
/// any other.
pub(crate) fn wait_for(
    fds: &[(BorrowedFd<'_>, PollFlags)],
    deadline: Option<Instant>,
) -> Vec<PollFlags> {
    let timeout = deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        }
    });
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|(fd, flags)| PollFd::from_borrowed_fd(*fd, *flags))
        .collect();
    let _ = poll(&mut pfds, timeout.as_ref());
    pfds.iter().map(PollFd::revents).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_timers_come_out_earliest_first_and_once() {
        let mut r = Timers::new();
        r.set(Timer::Stats, Duration::ZERO);
        r.set(Timer::WritePass, Duration::from_nanos(1));
        r.set(Timer::Stop, Duration::from_secs(3600));
        assert!(r.next_due().is_some_and(|d| d <= Instant::now()));
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(r.due(), vec![Timer::Stats, Timer::WritePass]);
        assert!(r.due().is_empty());
        r.cancel(Timer::Stop);
        assert_eq!(r.next_due(), None);
    }

    #[test]
    fn a_wait_ends_at_its_deadline_or_a_readable_descriptor() {
        let t = Instant::now();
        assert!(wait_for(&[], Some(t + Duration::from_millis(5))).is_empty());
        assert!(t.elapsed() >= Duration::from_millis(5));
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        std::io::Write::write_all(&mut &b, b"x").expect("write");
        use std::os::fd::AsFd;
        let ready = wait_for(&[(a.as_fd(), PollFlags::IN)], None);
        assert_eq!(ready.len(), 1);
        assert!(ready[0].contains(PollFlags::IN));
    }
}

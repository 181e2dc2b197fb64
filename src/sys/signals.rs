//! SIGINT and SIGTERM for a recording session: each one becomes a byte on a
//! pipe the event loop polls, and the third one kills the process at once,
//! from the handler itself, so it works even while the loop is blocked (a
//! final write to a slow reader of `-o -`, say).
//!
//! Invariants:
//! - SG1 The handler only touches an `AtomicUsize` and, from the third signal
//!   on, calls `signal_hook::low_level::emulate_default_handler`; both are
//!   async-signal-safe. It allocates nothing and takes no lock.
//! - SG2 The counter outlives every registration: the handler owns an `Arc`
//!   of it, and the registrations are removed in `Drop` before the pipe
//!   closes.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use signal_hook::SigId;
use signal_hook::consts::{SIGINT, SIGTERM};

/// The signal that ends the process without waiting for the loop.
const KILLING_SIGNAL: usize = 3;

/// SIGINT/SIGTERM as the loop sees them.
pub(crate) struct Signals {
    rx: UnixStream,
    ids: Vec<SigId>,
}

impl Signals {
    /// Installs the handlers for SIGINT and SIGTERM.
    pub(crate) fn install() -> std::io::Result<Self> {
        let (rx, tx) = UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        let seen = Arc::new(AtomicUsize::new(0));
        let mut ids = Vec::new();
        for sig in [SIGINT, SIGTERM] {
            let seen = seen.clone();
            let count = move || {
                if seen.fetch_add(1, Ordering::SeqCst) + 1 >= KILLING_SIGNAL {
                    let _ = signal_hook::low_level::emulate_default_handler(sig);
                }
            };
            // SAFETY: SG1 — the closure is async-signal-safe; SG2 — it owns
            // what it touches.
            ids.push(unsafe { signal_hook::low_level::register(sig, count) }?);
            ids.push(signal_hook::low_level::pipe::register(
                sig,
                tx.try_clone()?,
            )?);
        }
        Ok(Self { rx, ids })
    }

    /// Readable when signals arrived: the loop polls it.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }

    /// How many signals arrived since the last call.
    pub(crate) fn take(&self) -> usize {
        let mut buf = [0u8; 16];
        let mut n = 0;
        let mut r = &self.rx;
        while let Ok(k) = r.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SG2: unregister before the pipe's write ends close.
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

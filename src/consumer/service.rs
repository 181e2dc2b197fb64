//! The accepting side: the consumer socket, each connection checked
//! (SO_PEERCRED, the connection quotas) and served on its own thread, and
//! the service's own stop on SIGINT/SIGTERM.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};

use super::ConsumerError;
use super::connection::Connection;
use super::registry::Registry;
use crate::control::message::Request;
use crate::sys::signals::Signals;

/// How long the service waits, at its stop, for sessions to end.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The consumer socket and what it serves.
pub struct ConsumerService {
    listener: UnixListener,
    path: PathBuf,
    registry: Arc<Registry>,
}

impl ConsumerService {
    /// Serves on `listener` (bound at `path`); sessions that need apps
    /// attach to `producers` when given.
    pub fn new(
        listener: UnixListener,
        path: PathBuf,
        producers: Option<crate::ipc::host::ProducerService>,
    ) -> Self {
        Self {
            listener,
            path,
            registry: Registry::new(producers),
        }
    }

    /// Sessions record linux.ftrace themselves on instances `remote` (the
    /// root broker) prepares, instead of leaving it to producers.
    pub fn serve_ftrace(&self, remote: Arc<dyn crate::sources::ftrace::remote::RemoteTracefs>) {
        self.registry.serve_ftrace(remote);
    }

    /// Sessions write their files through the page cache even where
    /// `O_DIRECT` works (`RECORDER_DIRECT_IO=off`).
    pub fn no_direct_io(&self) {
        self.registry.no_direct_io();
    }

    /// Accepts until SIGINT or SIGTERM, then stops every session and
    /// waits (bounded) for them to end.
    pub fn run(self) -> Result<(), ConsumerError> {
        let signals = Signals::install().map_err(|source| ConsumerError::Io {
            what: "signal handlers",
            source,
        })?;
        log::info!("consumer socket: {}", self.path.display());
        loop {
            let mut fds = [
                PollFd::new(&self.listener, PollFlags::IN),
                PollFd::from_borrowed_fd(signals.fd(), PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(ConsumerError::Io {
                        what: "poll",
                        source: e.into(),
                    });
                }
            }
            if signals.take() > 0 {
                break;
            }
            self.accept_all();
        }
        log::info!("stopping: ending every session");
        for c in self.registry.controls() {
            let _ = c.ask(Request::Stop {}, 0, 0, Duration::from_secs(1));
        }
        let deadline = Instant::now() + STOP_GRACE;
        while self.registry.pending() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for (uid, n) in self.registry.refused() {
            log::info!("uid {uid}: {n} connections or sessions refused by quota");
        }
        let _ = std::fs::remove_file(&self.path);
        if let Some(p) = self.registry.producer_path() {
            let _ = std::fs::remove_file(p);
        }
        Ok(())
    }

    fn accept_all(&self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: the client is refused, the
                    // service goes on.
                    log::warn!("consumer socket: accept: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            let cred = match rustix::net::sockopt::socket_peercred(stream.as_fd()) {
                Ok(c) => c,
                Err(e) => {
                    log::info!("consumer connection without credentials ({e}): closed");
                    continue;
                }
            };
            let (uid, pid) = (cred.uid.as_raw(), cred.pid.as_raw_nonzero().get() as u32);
            let slot = match self.registry.admit(uid) {
                Ok(s) => s,
                Err(e) => {
                    log::info!("consumer connection refused: {e}");
                    continue;
                }
            };
            let registry = self.registry.clone();
            let spawned = std::thread::Builder::new()
                .name("recorder-consumer".into())
                .spawn(
                    move || match Connection::new(stream, uid, pid, registry, slot) {
                        Ok(c) => c.serve(),
                        Err(e) => log::info!("consumer connection: {e}"),
                    },
                );
            if let Err(e) = spawned {
                log::warn!("consumer connection thread: {e}");
            }
        }
    }
}

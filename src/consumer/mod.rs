//! `recorder serve`: Perfetto's ConsumerPort, so the stock `perfetto` client
//! (and anything else built on the consumer API) records through the
//! recorder, with every session hosted by one service.
//!
//! ```text
//!            ┌───────────────────── one thread, one poll(2) ─────────────────────┐
//!  perfetto ─┼─► consumer socket ─► connection ─► port (methods) ─► Command ─┐    │
//!            │     (SO_PEERCRED,       (frames in,                           ▼    │
//!            │      quotas)             replies out)    sessions: Runner, Runner, …
//!  SDK apps ─┼─► producer socket ─► ProducerService ──► (their buffers, sources,
//!            │                                            timers, outputs)  │    │
//!            │  ◄── replies, ReadBuffers slices ◄── SessionEvent ◄──────────┘    │
//!            └────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! The service ([`service`]) waits once for everything it hosts: the
//! consumer and producer sockets, every session's timers, sources and
//! output. Each EnableTracing becomes a session (`build`) hosted on that
//! loop as an [`event_loop::Runner`](crate::event_loop::Runner): its own
//! buffers, built-in sources (driven by the loop's timers) and output,
//! written at the end into an in-memory file, or streamed into the client's
//! file for `write_into_file`. The connection talks to its session in types
//! ([`crate::event_loop::Command`] in, [`crate::event_loop::SessionEvent`]
//! out); nothing polls. The threads of the service do not grow with its
//! sessions, their data sources or the requests.
//!
//! A session belongs to the connection that holds it; Detach hands it to
//! the service under its uid and a key, Attach to the next connection of
//! that uid. CloneSession makes a session of its own from a copy of
//! another's buffers. Every byte from a consumer is untrusted: frames are
//! bounded by the IPC framing ([`crate::transport::frame`]), the [`Limits`] are
//! checked before anything is allocated, a session is charged to its uid
//! until it has really ended (a client that goes leaves a session that
//! stops, and one that cannot stop is aborted at a hard deadline), and the
//! log lines a uid causes are bounded ([`crate::transport::log_budget`]).

mod build;
mod connection;
mod methods;
mod readback;
pub(crate) mod service;
pub(crate) mod sessions;
pub(crate) mod wire;

use std::path::PathBuf;

/// Consumer connections open at once, at most, by default.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// Consumer connections one uid may hold open at once, by default.
pub(crate) const MAX_CONNECTIONS_PER_UID: usize = 16;
/// Sessions at once (as Perfetto's service), by default.
pub(crate) const MAX_SESSIONS: usize = 15;
/// Sessions one uid may run at once (as Perfetto's service), by default.
pub const MAX_SESSIONS_PER_UID: usize = 5;
/// Buffer bytes one uid's sessions may hold in all.
pub(crate) const MAX_BUFFER_BYTES_PER_UID: u64 = 512 << 20;
/// Buffer bytes every session may hold in all.
pub(crate) const MAX_BUFFER_BYTES: u64 = 2 << 30;

/// What the service holds at most. The defaults are traced's for
/// sessions; `recorder serve --max-sessions N --max-sessions-per-uid M`
/// sets them (and raises the connections with them: a session's client
/// holds one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    pub sessions: usize,
    pub(crate) sessions_per_uid: usize,
    pub connections: usize,
    pub connections_per_uid: usize,
    pub buffer_bytes: u64,
    pub(crate) buffer_bytes_per_uid: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            sessions: MAX_SESSIONS,
            sessions_per_uid: MAX_SESSIONS_PER_UID,
            connections: MAX_CONNECTIONS,
            connections_per_uid: MAX_CONNECTIONS_PER_UID,
            buffer_bytes: MAX_BUFFER_BYTES,
            buffer_bytes_per_uid: MAX_BUFFER_BYTES_PER_UID,
        }
    }
}

impl Limits {
    /// The defaults with `sessions` in all and `per_uid` per uid where
    /// given; connections follow, two per session, never below their
    /// defaults.
    pub(crate) fn with_sessions(sessions: Option<usize>, per_uid: Option<usize>) -> Self {
        let d = Self::default();
        let sessions = sessions.unwrap_or(d.sessions).max(1);
        let per_uid = per_uid.unwrap_or(d.sessions_per_uid).clamp(1, sessions);
        Self {
            sessions,
            sessions_per_uid: per_uid,
            connections: d.connections.max(2 * sessions),
            connections_per_uid: d.connections_per_uid.max(2 * per_uid),
            ..d
        }
    }
}

/// `PERFETTO_CONSUMER_SOCK_NAME`: where consumers connect.
pub(crate) const ENV_VAR: &str = "PERFETTO_CONSUMER_SOCK_NAME";
const RUN_DIR: &str = "/run/perfetto";
const RUN_SOCKET: &str = "/run/perfetto/traced-consumer.sock";
const TMP_SOCKET: &str = "/tmp/perfetto-consumer";

/// Errors of serving consumers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsumerError {
    #[error("an abstract or network consumer socket ({0}) is not supported: give a path")]
    NotAPath(String),
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The path to listen on: the flag, else the environment, else where the
/// `perfetto` client looks by default on this machine.
pub(crate) fn socket_path(flag: Option<&std::path::Path>) -> Result<PathBuf, ConsumerError> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    if let Ok(e) = std::env::var(ENV_VAR)
        && !e.is_empty()
    {
        if e.starts_with('@') || e.starts_with("vsock://") || e.contains(',') || e.contains(':') {
            return Err(ConsumerError::NotAPath(e));
        }
        return Ok(PathBuf::from(e));
    }
    let run_ok = rustix::fs::access(RUN_DIR, rustix::fs::Access::EXEC_OK).is_ok();
    Ok(PathBuf::from(if run_ok { RUN_SOCKET } else { TMP_SOCKET }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_limits_are_set_and_connections_follow() {
        assert_eq!(Limits::with_sessions(None, None), Limits::default());
        let l = Limits::with_sessions(Some(100), Some(10));
        assert_eq!((l.sessions, l.sessions_per_uid), (100, 10));
        assert_eq!((l.connections, l.connections_per_uid), (200, 20));
        assert_eq!(l.buffer_bytes_per_uid, MAX_BUFFER_BYTES_PER_UID);
        // A per-uid limit is never above the whole.
        assert_eq!(Limits::with_sessions(Some(3), Some(9)).sessions_per_uid, 3);
    }
}

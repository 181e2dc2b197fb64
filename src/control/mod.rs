//! The control plane (DESIGN §7): every running session listens in one
//! machine-wide runtime directory on two unix sockets:
//!
//! - `recorder-PID.trigger`, mode 0666: anyone may connect, and it accepts
//!   trigger names and nothing else (an unprivileged app names an event);
//! - `recorder-PID.control`, mode 0600 plus a check of the peer's
//!   credentials: the session's owner or root may query or stop it.
//!
//! A request is one JSON line of at most [`message::MAX_REQUEST_BYTES`]; the
//! reply is one JSON line. Malformed or oversized requests are refused and
//! counted, and each connection is served on the control thread with a
//! deadline, so no client can stall the session.

pub mod client;
pub mod history;
pub mod message;
pub mod runtime_dir;
pub mod server;

/// Errors of the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("runtime directory {path}: {source}")]
    RuntimeDir {
        path: String,
        source: std::io::Error,
    },
    #[error("socket {path}: {source}")]
    Socket {
        path: String,
        source: std::io::Error,
    },
    #[error("no running recorder session in {0}")]
    NoSessions(String),
    #[error("session {pid}: {msg}")]
    Session { pid: u32, msg: String },
    #[error("bad reply from session {pid}: {msg}")]
    BadReply { pid: u32, msg: String },
}

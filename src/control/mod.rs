//! The control plane (ARCHITECTURE.md §10): every running session listens in one
//! machine-wide runtime directory on two unix sockets:
//!
//! - `recorder-PID.trigger`, mode 0666: anyone may connect, and it accepts
//!   trigger names and nothing else (an unprivileged app names an event);
//! - `recorder-PID.control`, mode 0600 plus a check of the peer's
//!   credentials: the session's owner or root may query or stop it.
//!
//! A request is one JSON line of at most [`wire::MAX_REQUEST_BYTES`]; the
//! reply is one JSON line of at most [`wire::MAX_REPLY_BYTES`]. The
//! runtime directory is shared with every local user, so both sides treat
//! it as hostile ground:
//!
//! - the session uses the directory only when its owner and mode are safe,
//!   and creates its entries through a checked descriptor ([`runtime_dir`]);
//! - the server multiplexes every connection on one thread with a deadline
//!   on the whole request and a cap per peer uid, so neither slow nor idle
//!   connections delay a trigger ([`server`]);
//! - clients believe an answer only from the process that owns the session
//!   (peer credentials), read bounded replies under one overall deadline and
//!   contact all sessions at once ([`client`]).

pub(crate) mod client;
pub(crate) mod history;
pub(crate) mod runtime_dir;
pub(crate) mod server;
pub(crate) mod session_name;
pub mod wire;

/// Errors of the control plane.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    #[error("runtime directory {path}: {source}")]
    RuntimeDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("runtime directory {path} is not safe to use: {why}")]
    UnsafeRuntimeDir {
        path: String,
        #[source]
        why: runtime_dir::UnsafeRuntimeDir,
    },
    #[error("runtime directory {path}: the way to it")]
    RuntimeParent {
        path: String,
        #[source]
        source: crate::storage::create::CreateError,
    },
    #[error("no usable runtime directory: {0}")]
    NoRuntimeDir(runtime_dir::Tried),
    #[error("{path}: {source}")]
    RuntimeFile {
        path: String,
        #[source]
        source: runtime_dir::OwnFileError,
    },
    #[error(
        "a session named {name:?} is already running (pid {pid}); unique_session_name allows one"
    )]
    NameTaken { name: String, pid: String },
    #[error("socket {path}: {source}")]
    Socket {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no running recorder session in {}", client::dirs_text_of(.0))]
    NoSessions(Vec<std::path::PathBuf>),
    #[error(
        "session {pid} closed the connection {attempts} times before reading the request (it is busy, or has as many connections from your uid as it takes): try again"
    )]
    Closed { pid: u32, attempts: u32 },
    /// The session's own words (a refusal it sent).
    #[error("session {pid}: {msg}")]
    Session { pid: u32, msg: String },
    #[error("session {0}: no such running session")]
    NoSuchSession(u32),
    #[error("bad reply from session {pid}: {source}")]
    BadReply {
        pid: u32,
        #[source]
        source: wire::BadReply,
    },
    #[error(
        "{path} is not session {pid}'s socket (it is served by pid {peer_pid}, uid {peer_uid}): not believed"
    )]
    Impostor {
        path: String,
        pid: u32,
        peer_pid: u32,
        peer_uid: u32,
    },
    #[error("session {pid} did not answer within {secs} s")]
    Timeout { pid: u32, secs: u64 },
}

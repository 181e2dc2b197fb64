//! The consumer socket of `recorder serve`: Perfetto's ConsumerPort, so the
//! stock `perfetto` client (and anything else built on the consumer API)
//! records through the recorder.
//!
//! ```text
//!  perfetto ──consumer socket──► service (accepts, SO_PEERCRED, quotas)
//!                                   │ one thread per connection
//!                                   ▼
//!                               connection ──EnableTracing──► session thread
//!                                   │                          (app + event_loop,
//!                                   │◄── reply when disabled ── output in memory)
//!                                   └──ReadBuffers──► readback (the memory file,
//!                                                      packet by packet, in slices)
//! ```
//!
//! Each EnableTracing is a session on the existing engine, with its own
//! buffers and built-in sources; its write pass writes into an in-memory
//! file (at the end, or for a ReadBuffers while it runs), which ReadBuffers
//! returns in the file's packet order, consuming what it returned. A
//! session belongs to the connection that holds it: Detach hands it to the
//! registry under its uid and a key, Attach to the next connection of that
//! uid. CloneSession makes a session of its own from a copy of another's
//! buffers (the flight recorder's snapshot writer, into memory). Every
//! byte from a consumer is untrusted: frames are bounded by the IPC framing
//! ([`crate::ipc::frame`]), and a uid holds at most
//! [`MAX_CONNECTIONS_PER_UID`] connections, [`MAX_SESSIONS_PER_UID`]
//! sessions and [`MAX_BUFFER_BYTES_PER_UID`] of buffers.

mod connection;
mod readback;
pub mod registry;
pub mod service;
mod session;
pub mod wire;

use std::path::PathBuf;

/// Consumer connections open at once, at most.
pub const MAX_CONNECTIONS: usize = 64;
/// Consumer connections one uid may hold open at once.
pub const MAX_CONNECTIONS_PER_UID: usize = 16;
/// Sessions at once (as Perfetto's service).
pub const MAX_SESSIONS: usize = 15;
/// Sessions one uid may run at once (as Perfetto's service).
pub const MAX_SESSIONS_PER_UID: usize = 5;
/// Buffer bytes one uid's sessions may hold in all.
pub const MAX_BUFFER_BYTES_PER_UID: u64 = 512 << 20;
/// Buffer bytes every session may hold in all.
pub const MAX_BUFFER_BYTES: u64 = 2 << 30;

/// `PERFETTO_CONSUMER_SOCK_NAME`: where consumers connect.
pub const ENV_VAR: &str = "PERFETTO_CONSUMER_SOCK_NAME";
const RUN_DIR: &str = "/run/perfetto";
const RUN_SOCKET: &str = "/run/perfetto/traced-consumer.sock";
const TMP_SOCKET: &str = "/tmp/perfetto-consumer";

/// Errors of serving consumers.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("consumer socket")]
    Socket(#[source] crate::ipc::socket_path::SocketPathError),
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
pub fn socket_path(flag: Option<&std::path::Path>) -> Result<PathBuf, ConsumerError> {
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

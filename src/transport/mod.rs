//! The transport the recorder's sockets share: where a socket lives and how
//! its path is claimed ([`socket_path`]), the length-prefixed `IpcFrame`
//! stream of Perfetto's IPC ([`frame`]: the producer and consumer ports),
//! who is at the other end ([`peer`]: `SO_PEERCRED`, and the bound on
//! per-uid tables), and the log lines a peer may cause ([`log_budget`]).
//!
//! Each port is a module of its own, named for its role, on top of this:
//! [`crate::producer`] (SDK apps, `traced_probes`), [`crate::consumer`]
//! (the `perfetto` client, `recorder serve`), [`crate::control`] (the
//! runtime directory's trigger and control sockets) and the broker's
//! socket pair ([`crate::privilege::wire`]). Each port's messages and
//! refusals live in its own `wire` module (the producer's in its protos
//! and [`crate::producer::connection`]).

pub mod frame;
pub(crate) mod log_budget;
pub(crate) mod peer;
pub(crate) mod socket_path;

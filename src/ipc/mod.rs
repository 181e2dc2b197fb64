//! Perfetto's producer IPC: apps built on the Perfetto SDK connect to the
//! producer socket, register data sources and write packets into shared
//! memory; the recorder copies committed chunks into its ring buffers in the
//! file's framing, with the trusted fields appended.
//!
//! - [`socket_path`]: where the socket lives and how it is claimed;
//! - [`frame`]: the length-prefixed `IpcFrame` stream;
//! - [`connection`]: one producer: the ProducerPort methods and commands;
//! - [`host`]: the listener, every connection, and the match of the
//!   config's data sources to what producers registered ([`filter`]);
//! - [`smb`]: the sealed shared memory and its chunk state machine (the one
//!   `unsafe` part, invariants S1–S3); [`chunk`]: a chunk's header and
//!   fragments; [`sequence`]: one writer's packets reassembled, validated
//!   and stored; [`stats`]: what each producer did.
//!
//! Known gaps against Perfetto's service: chunks still open in an app's
//! memory are not scraped at flushes and the stop; the shared-memory
//! emulation mode and producer-provided memory (startup tracing) are not
//! offered; data sources are set up and started together at the start, and
//! `will_notify_on_start` is noted, not waited for.
//!
//! Everything read from a socket or shared memory is untrusted until
//! checked; a producer that breaks the protocol loses its connection and
//! the refusal is counted, never a panic.

pub mod chunk;
pub mod connection;
pub mod filter;
pub mod frame;
pub mod host;
pub mod sequence;
pub mod smb;
pub mod socket_path;
pub mod stats;

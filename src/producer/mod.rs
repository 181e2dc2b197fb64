//! The producer port: Perfetto's ProducerPort, where apps built on the
//! Perfetto SDK connect, register data sources and write packets into shared
//! memory; the recorder copies committed chunks into its ring buffers in the
//! file's framing, with the trusted fields appended. Its transport (the
//! socket's path, the `IpcFrame` stream, the log budget) is
//! [`crate::transport`]'s, shared with the consumer port.
//!
//! - [`connection`]: one producer: the ProducerPort methods and commands;
//! - [`registry`]: the listener, every connection, and the sessions
//!   attached to it, each owning a range of buffer ids that committed chunks
//!   are routed by; the match of each session's data sources to what
//!   producers registered ([`filter`]);
//! - [`host`]: a session's handle on the registry: its own (`recorder
//!   --config`) or the [`host::ProducerService`] that `recorder serve` keeps
//!   for every session;
//! - [`smb`]: the sealed shared memory and its chunk state machine (the one
//!   `unsafe` part, invariants S1–S3); [`chunk`]: a chunk's header and
//!   fragments; [`sequence`]: one writer's packets reassembled, validated
//!   and stored; [`stats`]: what each producer did;
//! - [`quota`]: what one uid's connections may cost, checked before
//!   allocating.
//!
//! Data sources are set up from the session's beginning and started with
//! it; start acks (`will_notify_on_start`) are awaited for
//! `all_data_sources_started`, never by the session's work. Chunks still
//! open in an app's memory are scraped at the end of each flush, at the
//! stop and at a disconnect ([`smb::SharedMemory::scrape`],
//! [`sequence::Sequence::on_scraped`]).
//!
//! Known gaps against Perfetto's service: the shared-memory emulation mode
//! is not offered (Perfetto uses it only on transports other than a Unix
//! socket, which is all the recorder listens on; a producer cannot ask for
//! it); producer-provided memory (startup tracing) is declined, so the SDK
//! falls back to ours; `last_flush_slow_data_sources` is not written;
//! `all_data_sources_started` waits only for instances started at the
//! session's start.
//!
//! Everything read from a socket or shared memory is untrusted until
//! checked; a producer that breaks the protocol loses its connection and
//! the refusal is counted, never a panic.

pub(crate) mod chunk;
pub mod connection;
pub(crate) mod filter;
pub(crate) mod host;
pub mod quota;
pub(crate) mod registry;
pub mod sequence;
pub(crate) mod smb;
pub mod stats;
#[cfg(test)]
mod writer_model;

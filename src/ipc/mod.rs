//! Perfetto's producer IPC: apps built on the Perfetto SDK connect to the
//! producer socket, register data sources and write packets into shared
//! memory; the recorder copies committed chunks into its ring buffers in the
//! file's framing, with the trusted fields appended.
//!
//! - [`frame`]: the length-prefixed `IpcFrame` stream.
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

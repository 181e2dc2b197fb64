//! Protobuf wire knowledge, in one place: varints, field keys, a walk over a
//! message's fields, the trace file's packet framing, and the field numbers
//! of the messages the recorder writes and reads. Readers (`trace`,
//! `storage`, `config`, `bench`) and writers (`trace::encoder`, the sources,
//! the engine's framing) all use it; nothing else hand-codes a varint or a
//! field number.
//!
//! It uses no other module of the crate, so every layer may use it.

pub mod fields;
pub mod framing;
pub(crate) mod key;
pub(crate) mod numbers;
pub(crate) mod varint;

pub use fields::{Field, Fields, Value, WireError, fields, for_each};
pub use key::{PackedKey, WireType, key, key_len};
pub use numbers::*;

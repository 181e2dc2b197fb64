//! Rust types generated at build time from our own `.proto` files in
//! `protos/` (package `perfetto.protos`), plus the schema's descriptor set for
//! reflection (the text-format parser walks it).
//!
//! Only `config`, `trace` and IPC wire code name these types; everything else
//! works on validated `*Spec` types.

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));

/// The serialized `FileDescriptorSet` of every file under `protos/`.
pub(crate) const DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/descriptor_set.bin"));

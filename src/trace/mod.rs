//! Trace encoding (packets we emit) and trace reading (framing, inspection).

pub mod encoder;
pub mod inspect;
pub(crate) mod inspect_set;
pub mod reader;
pub mod salvage;
pub mod service;
pub(crate) mod service_log;
pub(crate) mod store;
pub(crate) mod untrusted;

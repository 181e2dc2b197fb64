//! Trace encoding (packets we emit) and trace reading (framing, inspection).

pub mod encoder;
pub mod inspect;
pub mod inspect_set;
pub mod reader;
pub mod salvage;
pub mod service;
pub mod service_log;
pub mod store;
pub mod untrusted;

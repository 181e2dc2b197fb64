//! Trace encoding (packets we emit) and trace reading (framing, inspection).

pub mod encoder;
pub mod service;
pub mod service_log;
pub mod inspect;
pub mod reader;

//! The one integration-test binary: it drives the built `recorder` binary
//! and the library, and decodes every trace with an independent decoder.

mod bench;
mod common;
mod config;
mod custom_fields;
mod fleet;
mod ftrace;
mod ftrace_mmap;
mod hardening;
mod layers;
mod lifecycle;
mod loss;
mod open;
mod privilege;
mod procfs;
mod producers;
mod quotas;
mod recording;
mod ringbuf;
mod schema;
mod segments;
mod serve;
mod serve_ftrace;
mod serve_producers;
mod storage;
mod trace_processor;
mod triggers;

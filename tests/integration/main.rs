//! The one integration-test binary: it drives the built `recorder` binary
//! and the library, and decodes every trace with an independent decoder.

#[macro_use]
mod harness;

mod bench;
mod config;
mod custom_fields;
mod fleet;
mod ftrace_encode;
mod ftrace_kernel;
mod ftrace_mmap;
mod ftrace_options;
mod hardening_files;
mod hardening_inputs;
mod hardening_sockets;
mod layers;
mod lifecycle;
mod light;
mod loss;
mod open;
mod oracles;
mod package;
mod privilege;
mod procfs;
mod producers;
mod quotas;
mod recording;
mod ringbuf;
mod rings;
mod rules;
mod saved;
mod schema;
mod segments;
mod serve_bridge;
mod serve_client;
mod serve_ftrace;
mod serve_producers;
mod serve_saved;
mod serve_service;
mod serve_sessions;
mod storage;
mod triggers;

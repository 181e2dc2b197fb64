//! `recorder`: records Linux traces in the Perfetto format, storage-first.
//!
//! # Architecture
//!
//! Data flows one way: a `TraceConfig` (text or binary) is loaded and
//! validated into a [`config::RecorderSpec`]; [`app`] builds the runtime
//! objects from it; data sources encode `TracePacket`s *in place* into the
//! chunks of mmap'd ring buffers ([`ringbuf`]); the flusher hands byte ranges
//! of those chunks straight to the kernel through a [`storage::FileSink`]
//! (io_uring, or `pwritev` where io_uring is blocked). No staging copy.
//!
//! ```text
//!  config ──load/validate──► RecorderSpec ──► app ──► session + event_loop
//!                                                 │
//!   sources (ftrace, /proc, for_testing) ──encode──► ringbuf chunks (mmap)
//!                                                 │ every file_write_period_ms
//!                                                 ▼
//!                                    storage::FileSink ──► trace file
//! ```
//!
//! Layers (a module uses only its own layer or lower ones):
//!
//! | layer | modules |
//! |---|---|
//! | 5 | `main`, [`cli`] |
//! | 4 | [`app`] |
//! | 3 | [`session`], [`event_loop`] |
//! | 2 | [`config`], [`sources`], [`control`], [`ipc`] |
//! | 1 | [`storage`], [`trace`] |
//! | 0 | [`ringbuf`], [`sys`], [`clock`], [`protos`] |
//!
//! Perfetto SDK apps are producers: they connect to the producer socket
//! ([`ipc`]), write into shared memory of their own, and the event loop
//! copies their committed chunks into the same ring buffers, in the file's
//! framing, with the trusted fields appended.
//!
//! `unsafe` is denied crate-wide and allowed only in [`ringbuf`], [`sys`],
//! the io_uring sink and the producers' shared-memory view
//! ([`ipc::smb`]), each block justified by a numbered invariant.

pub mod bytes;
pub mod clock;
pub mod protos;
pub mod ringbuf;
pub mod sys;

pub mod storage;
pub mod trace;

pub mod config;
pub mod control;
pub mod ipc;
pub mod sources;

pub mod event_loop;
pub mod session;

pub mod app;
pub mod bench;
pub mod summary;

pub mod cli;
pub mod command;

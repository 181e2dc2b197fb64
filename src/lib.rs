//! `recorder`: records Linux traces in the Perfetto format, storage-first.
//!
//! The contract in full (layers, numbered invariants, the wire facts the
//! code relies on, the threat model) is `ARCHITECTURE.md` at the
//! repository's root; this page is its summary.
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
//! Who decides and who acts: [`session`] holds every lifecycle decision as
//! a pure function, `Session::on_event(event, now) -> Vec<Action>` (cadences,
//! triggers, the stop sequence, snapshots, rotation), unit-tested without a
//! kernel. [`event_loop`] executes: a [`event_loop::Runner`] turns what
//! happened to one session into events, queues them (no nested dispatch) and
//! runs the actions against buffers, sources and the output; it never
//! waits. Its host waits once for all it hosts: the main job's one session,
//! or every session of `recorder serve` on one loop ([`consumer`]); data
//! sources have no threads, their work is the host's wake-ups. Each action carries its choices (a pass's fdatasync, a
//! snapshot's take of each buffer, the stop's flush), so the executor,
//! unit-tested against fake sources and sinks, makes none. A new event
//! source touches the reactor and the session.
//!
//! The protobuf wire format is known in one place, [`wire`]: varints, field
//! keys, a field walk over untrusted bytes, the file's packet framing and the
//! field numbers of every message written or read. Sources hand packets to
//! one [`sources::output::PacketOutput`], which lends the engine's
//! [`ringbuf::PacketSlot`] for encoding in place.
//!
//! Layers (a module uses only its own layer or lower ones):
//!
//! | layer | modules | what they are |
//! |---|---|---|
//! | 5 | `main`, [`cli`], [`command`] | argument types; one module per command, exit codes |
//! | 4 | [`app`], [`bench`](mod@bench), [`consumer`], [`summary`] | build a recording from a spec; the bench; the consumer socket of `recorder serve` (sessions for the `perfetto` client); the end-of-run report |
//! | 3 | [`session`], [`event_loop`] | decide; execute |
//! | 2 | [`config`], [`sources`], [`control`], [`producer`], [`privilege`] | TraceConfig to spec; data sources; the control socket and runtime dir; the producer socket and shared memory; the root broker and the drop to the service user |
//! | 1 | [`storage`], [`trace`], [`transport`] | sinks, write passes, segments, compression; trace packets we write and read; socket paths, IPC frames, peers and their log budget |
//! | 0 | [`ringbuf`], [`sys`], [`clock`], [`protos`], [`wire`], [`bytes`] | the engine; signals and daemon; clocks; generated protos; the wire format; byte counts for people |
//!
//! Perfetto SDK apps are producers: they connect to the producer socket
//! ([`producer`]), write into shared memory of their own, and the event loop
//! copies their committed chunks into the same ring buffers, in the file's
//! framing, with the trusted fields appended.
//!
//! `unsafe` is denied crate-wide and allowed only in [`ringbuf`], [`sys`],
//! the io_uring sink and the producers' shared-memory view
//! ([`producer::smb`]), each block justified by a numbered invariant in a
//! `// SAFETY:` comment (`clippy::undocumented_unsafe_blocks` is denied).

// A `pub` item must be reachable from outside the crate: what only the
// crate uses says `pub(crate)`, so the compiler finds what nothing uses.
// What stays public (the binary's, benches', fuzz targets' and tests' view)
// says what it is.
#![warn(unreachable_pub)]
#![warn(missing_docs)]
// The docs are built with `--document-private-items` (the modules the
// binary alone uses are part of the contract), so links to them resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod bytes;
pub mod clock;
pub mod protos;
pub mod ringbuf;
pub(crate) mod sys;
pub mod wire;

pub mod storage;
pub mod trace;
pub mod transport;

pub mod config;
pub mod control;
pub mod producer;
pub mod sources;

pub(crate) mod event_loop;
pub mod privilege;
pub(crate) mod session;

pub(crate) mod app;
pub mod bench;
pub mod consumer;
pub(crate) mod summary;

pub(crate) mod cli;
pub mod command;

//! `recorder bench`: measures how buffer policies, sizes, chunk sizes and
//! write periods behave under a load, through the real engine: writer
//! threads on the real [`Writer`](crate::ringbuf::Writer) API, the real
//! write pass ([`write_pass`](crate::storage::write_pass::write_pass)) into
//! the real sink (io_uring, or `pwritev` where it is blocked), then a decode
//! of the file that checks its sequence numbers show exactly the loss the
//! counters report.
//!
//! ```text
//!  Sweep (comma lists) ──configs()──► BenchConfig × N ──run_config──► ConfigReport × N
//!                                        │                              │
//!   writer threads (workload) ─ begin_packet/commit ─► Buffer          ├─► table (people)
//!   flusher loop: write_pass every period ──────────► FileSink         ├─► JSON lines (--json)
//!   verify: walk framing, for_testing counters per sequence            └─► SVG (--plot)
//! ```
//!
//! Timing never touches the per-packet path: write latency is the mean of
//! batches of 64 packets, and only the `begin_packet` calls that take a new
//! chunk are timed (the writer knows which, from the reserved packet size).
//!
//! # JSON schema (`--json`: one object per configuration, one per line)
//!
//! | key | type | meaning |
//! |---|---|---|
//! | `index` | int | position in the sweep (0-based) |
//! | `writers` | int | writer threads |
//! | `packet_size` | int \| null | swept TracePacket size in bytes (null with `--config`) |
//! | `policy`, `buffer_kb`, `chunk_kb` | str, int, float | first buffer's policy (`ring`/`discard`), size, chunk size |
//! | `write_period_ms` | int | period of the write passes (after the 100 ms minimum) |
//! | `rate_pps` | float \| null | offered rate asked for; null: `--max-rate` |
//! | `sink` | str | `io_uring`, `pwritev`, or `none` (`--no-output`) |
//! | `output` | str \| null | the kept trace file |
//! | `elapsed_s` | float | the writers' time: from their common start (every writer thread running, released at once) to the last packet offered; the rates are per this |
//! | `wall_s` | float | from the common start to the end of the last pass and sync |
//! | `warnings` | [str] | why the figures may not be representative (a run under 1 s, fewer than 3 passes) |
//! | `offered_packets`, `accepted_packets` | int | packets offered / stored |
//! | `offered_pps`, `accepted_pps` | float | per second |
//! | `offered_mbps`, `accepted_mbps` | float | framed bytes, 10^6 per second |
//! | `bytes_offered`, `bytes_written`, `bytes_overwritten`, `bytes_discarded`, `bytes_retained` | int | framed bytes; retained = reached the file |
//! | `packets_overwritten`, `packets_discarded`, `packets_refused`, `packets_retained` | int | packets |
//! | `retained_pct` | float | retained / offered packets × 100 |
//! | `write_latency`, `acquire_latency` | object | `{count, p50_ns, p99_ns, p999_ns, max_ns}` |
//! | `acquire_failures` | int | chunk acquisitions that found no chunk |
//! | `passes` | object | `{count, duration: {…percentiles}, bytes_mean, bytes_max, longest_ms, total_ms, final_ms}`; `final_ms` is the pass after the writers stopped, outside `elapsed_s` |
//! | `cpu` | object | `{user_s, sys_s, total_s}` (whole process during the run) |
//! | `peak_rss_kb` | int | peak RSS during the run (reset per configuration where the kernel allows) |
//! | `buffers` | array | per buffer: `index, policy, size_kb, chunk_kb`, the counters above, `retained_pct`, `buffer_bytes_per_packet`, `peak_window_bytes`, `peak_window_ms`, `min_size_kb`, `lossless_rate_pps`, `balanced` |
//! | `verify` | object | `{ok, checked, packets_in_file, test_packets, lost_in_file, lost_counted, streaming_passes, retention: [object], problems: [str]}` |
//! | `verify.streaming_passes` | int | write passes that took data while the writers wrote; 0: the file is what the buffers held at the end |
//! | `verify.retention[]` | object | per writer sequence: `sequence`, `policy`, `offered`, `accepted`, `kept` (test packets in the file), `first_kept`, `last_kept`, `first_accepted`, `last_accepted` (counters, null if none), `runs` (contiguous runs of counters), `lost_before`, `lost_between`, `lost_after` (counters missing before the first kept, between, after the last kept up to the last offered), `unmarked_gaps` (gaps with no loss marker in their place), `trailing_marker`, `streaming`, `shape` |
//! | `verify.retention[].shape` | str | `all`, `newest` (one run ending at the last accepted packet), `oldest` (one run from counter 0), `middle`, `runs` (several), `none` |
//!
//! `verify.ok` also requires what each policy promises about which packets
//! are kept (stated exactly in [`verify`]): RING_BUFFER keeps the newest
//! (`last_kept == last_accepted`, and one run when no pass streamed during
//! the writes), DISCARD keeps every accepted packet from the first, and
//! every gap carries a loss marker. The table's `kept` column is the shape
//! shared by every sequence (`mixed` otherwise).
//!
//! Sizing advice: `peak_window_bytes` is the most that was offered between
//! one pass taking a buffer's data and the next pass releasing it, which the
//! buffer must hold at once; `min_size_kb` adds one chunk per writer and
//! chunk padding; `lossless_rate_pps` is the rate this buffer holds without
//! loss over the longest such window.

pub(crate) mod histogram;
pub(crate) mod plot;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod sweep;
pub(crate) mod table;
pub(crate) mod usage;
pub mod verify;
pub mod workload;

pub use report::ConfigReport;
pub use run::{BenchConfig, BufferSetup, OutputTarget, run_config};
pub use sweep::{OutputPlan, StopAt, Sweep, from_spec};

/// Why a bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The command line or the config asks for what the bench cannot run;
    /// the message says what.
    #[error("{0}")]
    Usage(&'static str),
    /// A swept option was given an empty list (the option named).
    #[error("{0} needs at least one value")]
    NoValue(&'static str),
    /// A buffer of the configuration could not be made.
    #[error("buffer {index}: {source}")]
    Buffer {
        /// Its position in the configuration.
        index: usize,
        /// What the engine refused.
        #[source]
        source: crate::ringbuf::RingbufError,
    },
    /// A writer of the config targets a buffer the config does not define
    /// (the index named).
    #[error("a writer targets buffer {0}, which does not exist")]
    NoSuchBuffer(usize),
    /// The trace file could not be opened.
    #[error("output: {0}")]
    Output(#[from] crate::storage::StorageError),
    /// Syncing the trace file after the last write pass failed.
    #[error("write failed: {0}")]
    Sink(crate::storage::SinkError),
    /// A write pass failed, so the run has no whole file to verify.
    #[error("write pass failed: {0}")]
    Pass(#[source] crate::storage::write_pass::PassError),
    /// The system refused to start a writer thread.
    #[error("cannot start a writer thread: {0}")]
    Thread(#[source] std::io::Error),
    /// A writer thread panicked; its counts are lost, so the run has no
    /// report.
    #[error("a writer thread panicked")]
    WriterPanicked,
}

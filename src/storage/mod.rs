//! The output path: file sinks (io_uring, `pwritev`, a stream) and write passes.

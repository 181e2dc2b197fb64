//! Fuzz oracles, one module per target. Each `check_*` function panics when
//! its oracle is violated; the libFuzzer targets in `fuzz_targets/` and the
//! corpus replay in `tests/replay.rs` both call them.
pub mod trace_reader;

//! Fuzz oracles, one module per target. Each `check_*` function panics when
//! its oracle is violated; the libFuzzer targets in `fuzz_targets/` and the
//! corpus replay in `tests/replay.rs` both call them.
pub mod config_binary;
pub mod config_text;
pub mod config_text_custom;
pub mod control_message;
pub mod control_reply;
pub mod ftrace_page;
pub mod ipc_frame;
pub mod ipc_sequence;
pub mod quota_model;
pub mod ring_image;
pub mod ringbuf_model;
pub mod sys_stats_text;
pub mod trace_reader;

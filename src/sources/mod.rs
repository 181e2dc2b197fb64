//! Data sources: ftrace, /proc process and system stats, `for_testing`.
pub mod ftrace;

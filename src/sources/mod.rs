//! Data sources: ftrace, /proc process and system stats, `for_testing`.

pub mod poller;
pub mod process_stats;
pub mod procfs;
pub mod sys_stats;

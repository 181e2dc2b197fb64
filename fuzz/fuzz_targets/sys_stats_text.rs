#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| recorder_fuzz::sys_stats_text::check(data));

#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| recorder_fuzz::control_reply::check(data));

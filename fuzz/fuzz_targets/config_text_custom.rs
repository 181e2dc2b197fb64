#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| recorder_fuzz::config_text_custom::check(data));

#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| recorder_fuzz::ring_image::check(data));

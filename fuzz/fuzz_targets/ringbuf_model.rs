//! libFuzzer target: the buffer engine against its model.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| recorder_fuzz::ringbuf_model::check(data));

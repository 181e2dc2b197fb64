#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| recorder_fuzz::ipc_frame::check(data));

//! libFuzzer target: the producer socket's per-uid quotas against their model.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| recorder_fuzz::quota_model::check(data));

//! Placeholder until the ringbuf benchmarks land.
fn main() {}

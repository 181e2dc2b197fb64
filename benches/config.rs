//! Placeholder until the config benchmarks land.
fn main() {}

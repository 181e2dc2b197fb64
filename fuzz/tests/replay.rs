//! Replays every committed corpus file through its oracle, on stable.

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut n = 0;
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let data = std::fs::read(e.path()).expect("corpus file readable");
            check(&data);
            n += 1;
        }
    }
    n
}

#[allow(dead_code)]
fn replay_nonempty(target: &str, check: fn(&[u8])) {
    let n = replay(target, check);
    assert!(n > 0, "corpus for {target} is empty");
}

#[test]
fn trace_reader_corpus() {
    replay_nonempty("trace_reader", recorder_fuzz::trace_reader::check);
}

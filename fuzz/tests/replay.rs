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

fn replay_nonempty(target: &str, check: fn(&[u8])) {
    let n = replay(target, check);
    assert!(n > 0, "corpus for {target} is empty");
}

#[test]
fn config_binary_corpus() {
    replay_nonempty("config_binary", recorder_fuzz::config_binary::check);
}

#[test]
fn config_text_corpus() {
    replay_nonempty("config_text", recorder_fuzz::config_text::check);
}

#[test]
fn config_text_custom_corpus() {
    replay_nonempty(
        "config_text_custom",
        recorder_fuzz::config_text_custom::check,
    );
}

#[test]
fn control_message_corpus() {
    replay_nonempty("control_message", recorder_fuzz::control_message::check);
}

#[test]
fn control_reply_corpus() {
    replay_nonempty("control_reply", recorder_fuzz::control_reply::check);
}

#[test]
fn ftrace_page_corpus() {
    replay_nonempty("ftrace_page", recorder_fuzz::ftrace_page::check);
}

#[test]
fn quota_model_corpus() {
    replay_nonempty("quota_model", recorder_fuzz::quota_model::check);
}

#[test]
fn ipc_frame_corpus() {
    replay_nonempty("ipc_frame", recorder_fuzz::ipc_frame::check);
}

#[test]
fn ipc_sequence_corpus() {
    replay_nonempty("ipc_sequence", recorder_fuzz::ipc_sequence::check);
}

#[test]
fn ring_image_corpus() {
    replay_nonempty("ring_image", recorder_fuzz::ring_image::check);
}

#[test]
fn ringbuf_model_corpus() {
    replay_nonempty("ringbuf_model", recorder_fuzz::ringbuf_model::check);
}

#[test]
fn sys_stats_text_corpus() {
    replay_nonempty("sys_stats_text", recorder_fuzz::sys_stats_text::check);
}

#[test]
fn trace_reader_corpus() {
    replay_nonempty("trace_reader", recorder_fuzz::trace_reader::check);
}

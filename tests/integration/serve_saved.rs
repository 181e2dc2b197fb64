//! `recorder serve` killed while its sessions record: the root broker,
//! which outlives the service, saves every session still recording into
//! its client's file (its buffers are on memfds it was handed), as a valid
//! trace that says the recorder died; a session that had ended before is
//! left as it was.

use std::time::Duration;

use crate::harness::*;

/// A flight recorder writing into its client's file: passes so far apart
/// that what it records stays in its ring until the service dies.
const FLIGHT_RECORDER: &str = r#"
buffers { size_kb: 1024 fill_policy: RING_BUFFER }
duration_ms: 600000
write_into_file: true
file_write_period_ms: 600000
data_sources { config { name: "for_testing" target_buffer: 0
  for_testing { message_count: 0 max_messages_per_second: 2000 message_size: 200 } } }
"#;

/// A short session that ends on its own before the service is killed.
const SHORT: &str = r#"
buffers { size_kb: 256 }
duration_ms: 500
write_into_file: true
data_sources { config { name: "for_testing" for_testing { message_count: 50 } } }
"#;

#[test]
fn a_killed_service_has_its_recording_sessions_saved_by_the_broker() {
    require!(need::tracebox(), need::root());
    // Root: the service drops to its user and keeps a broker.
    let mut serve = Serve::start();
    let (short, short_out) = serve.spawn_client(None, "short", SHORT);
    let o = wait_within(short, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    let short_before = std::fs::read(&short_out).expect("the short trace");
    assert!(!short_before.is_empty());

    let (client, out) = serve.spawn_client(None, "flight", FLIGHT_RECORDER);
    // Two seconds of packets in the service's ring; the file holds only
    // the head written at the start (no pass was due since).
    wait_written(serve.pid(), 4000);
    let head = std::fs::read(&out).expect("the head");
    assert!(!head.is_empty(), "the head is written at the start");
    let in_file = for_testing_count(&decode(&head));
    assert!(
        in_file < 1000,
        "{in_file} packets were written before the death"
    );
    let mut service = serve.child.take().expect("serve");
    service.kill().expect("SIGKILL");
    service.wait().expect("reaped");
    let _ = wait_within(client, Duration::from_secs(30));

    // The broker says so once the save is written and synced (the file
    // is a whole trace at every step of it, so its bytes cannot tell).
    wait_for_text("its buffers were saved", Duration::from_secs(60), || {
        serve.log()
    });
    let data = std::fs::read(&out).expect("the saved trace");
    assert!(says_recorder_died(&decode(&data)));
    check_saved(&out);
    let counters = contiguous_counters(&data);
    assert!(counters.len() >= 3000, "{} packets saved", counters.len());
    assert!(serve.log().contains("saved"), "{}", serve.log());
    // The session that had ended is left as it was: nothing twice.
    assert_eq!(std::fs::read(&short_out).expect("short"), short_before);
}

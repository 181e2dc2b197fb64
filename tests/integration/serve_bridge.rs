//! The Perfetto UI's way into `recorder serve`: the ConsumerPort spoken over
//! `websocket_bridge` (tracebox), a session recorded and read back through
//! it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::consumer_port as port;
use crate::harness::serve::{kinds, text_config};
use crate::harness::*;

/// A minimal websocket client (RFC 6455): what the Perfetto UI's record
/// page opens to `websocket_bridge`, whose `/traced` endpoint passes each
/// binary message's bytes to the consumer socket and back.
struct Websocket {
    tcp: std::net::TcpStream,
    /// Bytes read and not yet parsed as frames.
    pending: Vec<u8>,
}

impl Websocket {
    fn connect(addr: &str, path: &str) -> std::io::Result<Websocket> {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(addr)?;
        // The key must be 16 bytes in base64: the bridge refuses others.
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: cmVjb3JkZXItc2VydmUtMQ==\r\nSec-WebSocket-Version: 13\r\n\
             Origin: https://ui.perfetto.dev\r\n\r\n"
        )?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if tcp.read(&mut byte)? == 0 {
                return Err(std::io::Error::other("closed during the handshake"));
            }
            head.push(byte[0]);
        }
        let status = String::from_utf8_lossy(&head);
        if !status.starts_with("HTTP/1.1 101") {
            return Err(std::io::Error::other(format!("no upgrade: {status}")));
        }
        Ok(Websocket {
            tcp,
            pending: Vec::new(),
        })
    }
}

impl port::Transport for Websocket {
    /// One binary message, masked as a client must.
    fn send(&mut self, bytes: &[u8]) {
        let mask: [u8; 4] = rand_mask();
        let mut f = vec![0x82];
        match bytes.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xffff => {
                f.push(0x80 | 126);
                f.extend((n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend((n as u64).to_be_bytes());
            }
        }
        f.extend(mask);
        f.extend(bytes.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        std::io::Write::write_all(&mut self.tcp, &f).expect("websocket send");
    }

    /// The payload of the next data frame (control frames skipped; a close
    /// frame is the end).
    fn recv(&mut self) -> Vec<u8> {
        loop {
            if let Some((opcode, payload, used)) = parse_ws_frame(&self.pending) {
                self.pending.drain(..used);
                match opcode {
                    0x0..=0x2 => return payload,
                    0x8 => panic!("the bridge closed the websocket"),
                    _ => continue,
                }
            }
            let mut buf = [0u8; 65536];
            let n = std::io::Read::read(&mut self.tcp, &mut buf).expect("websocket read");
            assert!(n > 0, "the bridge closed the connection");
            self.pending.extend_from_slice(&buf[..n]);
        }
    }
}

fn rand_mask() -> [u8; 4] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    t.to_le_bytes()
}

/// (opcode, payload, bytes used) of the first whole frame in `b`.
fn parse_ws_frame(b: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    if b.len() < 2 {
        return None;
    }
    let opcode = b[0] & 0x0f;
    let masked = b[1] & 0x80 != 0;
    let (len, mut at) = match b[1] & 0x7f {
        126 => (u16::from_be_bytes([*b.get(2)?, *b.get(3)?]) as usize, 4),
        127 => (
            u64::from_be_bytes(b.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    let mask = if masked {
        let m: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
        at += 4;
        Some(m)
    } else {
        None
    };
    let data = b.get(at..at + len)?;
    let payload = match mask {
        Some(m) => data.iter().enumerate().map(|(i, x)| x ^ m[i % 4]).collect(),
        None => data.to_vec(),
    };
    Some((opcode, payload, at + len))
}

/// `tracebox websocket_bridge` in front of `serve`; killed on drop (its
/// log shown if the test failed). Its port is fixed (8037), so one bridge
/// at a time.
struct Bridge(Child, std::path::PathBuf);

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.1).unwrap_or_default();
            eprintln!("--- websocket_bridge ---\n{log}--- end of websocket_bridge ---");
        }
    }
}

const BRIDGE: &str = "127.0.0.1:8037";

#[test]
fn the_ui_records_through_websocket_bridge() {
    require!(need::tracebox());
    // Someone else's bridge would talk to someone else's service.
    require!(need::present(
        std::net::TcpStream::connect(BRIDGE).is_err(),
        "port 8037 is taken: the bridge cannot start",
    ));
    use prost::Message;
    use recorder::protos;
    // Debug: a connection's end and its reason are logged at that level.
    let serve = Serve::start_with(&[("RUST_LOG", "debug")]);
    let bridge_log = serve.path("bridge.log");
    let _bridge = Bridge(
        Command::new(need::tracebox_path().expect("tracebox"))
            .arg("websocket_bridge")
            .env("PERFETTO_CONSUMER_SOCK_NAME", serve.consumer())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&bridge_log).expect("bridge log"))
            .spawn()
            .expect("websocket_bridge"),
        bridge_log,
    );
    wait_for("the bridge listening", Duration::from_secs(10), || {
        std::net::TcpStream::connect(BRIDGE).is_ok()
    });
    let ws = || port::Consumer::bind(Websocket::connect(BRIDGE, "/traced").expect("websocket"));
    let mut ui = ws();
    // What the record page asks first: the service and its data sources.
    let r = ui.ask(
        "QueryServiceState",
        &protos::QueryServiceStateRequest::default(),
    );
    let st = protos::QueryServiceStateResponse::decode(r.proto.as_slice())
        .expect("state")
        .service_state
        .expect("service_state");
    let names: Vec<String> = st
        .data_sources
        .iter()
        .filter_map(|d| d.ds_descriptor.as_ref()?.name.clone())
        .collect();
    assert!(names.iter().any(|n| n == "linux.sys_stats"), "{names:?}");
    let cfg = text_config(
        r#"
buffers { size_kb: 4096 fill_policy: RING_BUFFER }
duration_ms: 60000
unique_session_name: "from_the_ui"
data_sources { config { name: "linux.process_stats"
  process_stats_config { scan_all_processes_on_start: true } } }
data_sources { config { name: "linux.sys_stats"
  sys_stats_config { meminfo_period_ms: 100 meminfo_counters: MEMINFO_MEM_FREE
                     stat_period_ms: 100 stat_counters: STAT_CPU_TIMES } } }
data_sources { config { name: "for_testing"
  for_testing { message_count: 100000 max_messages_per_second: 50 } } }
"#,
    );
    let enable = ui.call(
        "EnableTracing",
        &protos::EnableTracingRequest {
            trace_config: Some(cfg),
            attach_notification_only: None,
        },
    );
    // The page polls the buffers' use while it records, until it shows.
    wait_for(
        "bytes written, as the page sees them",
        Duration::from_secs(20),
        || {
            let r = ui.ask("GetTraceStats", &protos::GetTraceStatsRequest {});
            assert!(r.success, "GetTraceStats: {}", serve.log());
            let ts = protos::GetTraceStatsResponse::decode(r.proto.as_slice())
                .expect("stats")
                .trace_stats
                .expect("trace_stats");
            assert_eq!(ts.buffer_stats.len(), 1);
            assert_eq!(ts.buffer_stats[0].buffer_size, Some(4096 * 1024));
            ts.buffer_stats[0].bytes_written.unwrap_or(0) > 0
        },
    );
    // Its snapshot button: a clone by name, on a second connection.
    let mut snap = ws();
    let r = snap.ask(
        "CloneSession",
        &protos::CloneSessionRequest {
            unique_session_name: Some("from_the_ui".into()),
            ..Default::default()
        },
    );
    let cr = protos::CloneSessionResponse::decode(r.proto.as_slice()).expect("clone");
    assert_eq!(cr.success, Some(true), "{:?}", cr.error);
    let snapshot = snap.read_buffers();
    // `snap` stays open until the end: Perfetto's bridge (v58.2) at times
    // closes its other websockets too when one closes, against its own
    // traced as well (2 of 10 runs under load, seen with this very flow).
    // Stop: Flush (initiator perfetto_cmd, reason trace stop), then
    // DisableTracing; the held EnableTracing reply; ReadBuffers.
    let r = ui.ask(
        "Flush",
        &protos::FlushRequest {
            timeout_ms: None,
            flags: Some((2 << 4) | 2),
        },
    );
    assert!(r.success, "Flush: {}", serve.log());
    let r = ui.ask("DisableTracing", &protos::DisableTracingRequest {});
    assert!(r.success);
    let r = ui.reply(enable);
    let resp = protos::EnableTracingResponse::decode(r.proto.as_slice()).expect("reply");
    assert_eq!(resp.error, None);
    let trace = ui.read_buffers();
    for (name, data) in [("ui.pftrace", &trace), ("ui_snapshot.pftrace", &snapshot)] {
        let out = serve.path(name);
        std::fs::write(&out, data).expect("write");
        let packets = decode(data);
        let counters = test_counters(&packets);
        let seq = counters.values().next().cloned().unwrap_or_default();
        assert!(!seq.is_empty(), "{name}: no for_testing packets");
        assert_eq!(seq, (0..seq.len() as u64).collect::<Vec<_>>(), "{name}");
        assert!(packets.iter().any(|p| p.has_process_tree()), "{name}");
        if let Some(k) = kinds(&out) {
            assert_eq!(
                k.get("for_testing").and_then(|v| v.as_u64()),
                Some(seq.len() as u64),
                "{name}"
            );
        }
        if let Some(tp) = trace_processor::check(&out) {
            assert!(
                tp.query("select count(*) from counter").scalar().int() > 5,
                "{name}"
            );
            assert!(
                tp.query("select count(*) from process").scalar().int() > 1,
                "{name}"
            );
        }
    }
    assert!(trace.len() > snapshot.len());
    drop(snap);
}

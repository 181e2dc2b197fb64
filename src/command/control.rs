//! `recorder trigger`, `query` and `stop`.

use crate::bytes::HumanBytes;

use super::ExitCode;
use crate::control::client::{self, Stopped, TriggerAnswer};
use crate::control::wire::{SessionStatus, UidQuotaStatus, printable};
use crate::producer::quota::{Limit, UidReport};

/// Fires `names` at every session; 0 when at least one session accepted
/// one of them (or, busy, queued them), 1 otherwise, saying which.
pub(crate) fn fire(names: &[String], producer: &str) -> ExitCode {
    // What a session would refuse is refused here, before connecting, with
    // the rule (and without echoing a huge or unprintable name).
    use crate::control::wire::{self, MAX_NAME_BYTES, MAX_REQUEST_BYTES, MAX_TRIGGER_NAMES};
    if names.len() > MAX_TRIGGER_NAMES {
        eprintln!(
            "recorder trigger: {} names; at most {MAX_TRIGGER_NAMES} at once",
            names.len()
        );
        return ExitCode::Usage;
    }
    for (what, n) in names
        .iter()
        .map(|n| ("trigger name", n))
        .chain(std::iter::once(("--producer", &producer.to_string())))
    {
        if !wire::valid_name(n) {
            eprintln!(
                "recorder trigger: {what} {} ({} bytes): a name is 1 to {MAX_NAME_BYTES} printable, non-space ASCII characters",
                crate::config::diagnostic::visible(n, 64),
                n.len()
            );
            return ExitCode::Usage;
        }
    }
    let size = wire::encode_request(&wire::Request::Trigger {
        names: names.to_vec(),
        producer: producer.to_string(),
    })
    .len();
    if size > MAX_REQUEST_BYTES {
        eprintln!(
            "recorder trigger: the names make a {size}-byte request; a session takes at most {MAX_REQUEST_BYTES}: send fewer at once"
        );
        return ExitCode::Usage;
    }
    let results = match client::fire_triggers(names, producer) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("recorder trigger: {e}");
            return ExitCode::Runtime;
        }
    };
    let mut any = false;
    for (pid, r) in results {
        match r {
            Ok(TriggerAnswer::Queued(why)) => {
                any = true;
                eprintln!("session {pid}: triggers {} queued: {why}", names.join(", "));
            }
            Ok(TriggerAnswer::Outcomes(outcomes)) => {
                for o in outcomes {
                    if o.accepted {
                        any = true;
                        eprintln!("session {pid}: trigger {:?} accepted", o.name);
                    } else {
                        let why = o.reason.unwrap_or_else(|| "no reason given".into());
                        eprintln!("session {pid}: trigger {:?} not taken ({why})", o.name);
                    }
                }
            }
            Err(e) => eprintln!("session {pid}: {e}"),
        }
    }
    if any {
        ExitCode::Success
    } else {
        eprintln!("recorder trigger: no session accepted {}", names.join(", "));
        ExitCode::Runtime
    }
}

/// Lists the live sessions: 0 when there are none or at least one
/// answered, 1 when every session refused or failed to answer.
pub(crate) fn query(json: bool) -> ExitCode {
    let all = client::query_all();
    let code = if all.is_empty() || all.iter().any(|(_, r)| r.is_ok()) {
        ExitCode::Success
    } else {
        ExitCode::Runtime
    };
    if json {
        let items: Vec<serde_json::Value> = all
            .iter()
            .map(|(pid, r)| match r {
                Ok(s) => serde_json::to_value(s).unwrap_or_default(),
                Err(e) => serde_json::json!({ "pid": pid, "error": e.to_string() }),
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return code;
    }
    if all.is_empty() {
        println!(
            "no running recorder sessions (looked in {})",
            client::dirs_text()
        );
        return ExitCode::Success;
    }
    for (pid, r) in &all {
        match r {
            Ok(s) => print!("{}", status_text(s)),
            Err(e) => println!("session {pid}: {e}"),
        }
    }
    if code != ExitCode::Success {
        eprintln!("recorder query: no session answered");
    }
    code
}

fn status_text(s: &SessionStatus) -> String {
    let mut t = format!(
        "session {} (uid {}): {}, {:.1} s, {} written to {}\n  config: {}\n",
        s.pid,
        s.uid,
        printable(&s.state),
        s.elapsed_ms as f64 / 1000.0,
        HumanBytes(s.bytes_written),
        printable(&s.output),
        printable(&s.config)
    );
    for b in &s.buffers {
        let fill = if b.size_bytes > 0 {
            100.0 * b.buffered_bytes as f64 / b.size_bytes as f64
        } else {
            0.0
        };
        t.push_str(&format!(
            "  buffer {} ({}, {}): {fill:.0}% full, {} written, {} overwritten, {} discarded, {} packets lost\n",
            b.index,
            printable(&b.policy),
            HumanBytes(b.size_bytes),
            HumanBytes(b.bytes_written),
            HumanBytes(b.bytes_overwritten),
            HumanBytes(b.bytes_discarded),
            b.packets_lost
        ));
    }
    if let Some(p) = &s.producer_socket {
        t.push_str(&format!("  producer socket: {}\n", printable(p)));
    }
    for p in &s.producers {
        let lost = if p.losses.is_empty() {
            format!("{} refused or lost", p.refused)
        } else {
            let why: Vec<String> = p
                .losses
                .iter()
                .map(|(what, n)| format!("{n} {}", printable(what)))
                .collect();
            format!("lost: {}", why.join(", "))
        };
        let scraped = if p.chunks_scraped > 0 {
            format!(", {} chunks scraped", p.chunks_scraped)
        } else {
            String::new()
        };
        t.push_str(&format!(
            "  producer {:?} (pid {}, uid {}{}): {}; {} packets, {}{scraped}, {lost}\n",
            printable(&p.name),
            p.pid,
            p.uid,
            if p.connected { "" } else { ", disconnected" },
            printable(&p.data_sources.join(", ")),
            p.packets,
            HumanBytes(p.bytes),
        ));
    }
    for q in &s.quotas {
        t.push_str(&quota_text(q));
    }
    for r in &s.rules {
        t.push_str(&format!(
            "  rule {:?}: matched {}, fired {}, taken {}, held back {} ({})\n",
            printable(&r.name),
            r.matched,
            r.fired,
            r.accepted,
            r.suppressed,
            printable(&r.text)
        ));
    }
    t
}

/// One uid's quota line, worded as the session's summary words it; a limit
/// this build does not know is shown by its key.
fn quota_text(q: &UidQuotaStatus) -> String {
    let mut known = UidReport {
        uid: q.uid,
        closed_producers: q.closed_producers,
        ..UidReport::default()
    };
    known.closed_stats.packets = q.closed_packets;
    known.closed_stats.bytes = q.closed_bytes;
    let mut unknown = Vec::new();
    for (key, n) in &q.hits {
        match Limit::from_key(key) {
            Some(l) => known.hits.add(l, *n),
            None => unknown.push(format!("{n} {}", printable(key))),
        }
    }
    let mut line = String::new();
    crate::summary::quota(&mut line, &known);
    if !unknown.is_empty() {
        let sep = if known.hits.is_empty() && known.closed_producers == 0 {
            " "
        } else {
            ", "
        };
        line.insert_str(line.len() - 1, &format!("{sep}{}", unknown.join(", ")));
    }
    line
}

/// Stops one session, or all the caller may stop: 0 when each one is
/// stopping (or already was, or has exited meanwhile), 1 otherwise.
pub(crate) fn stop(pid: Option<u32>, all: bool) -> ExitCode {
    let results = match (pid, all) {
        (Some(p), _) => vec![(p, client::stop(p))],
        (None, true) => {
            let r = client::stop_all();
            if r.is_empty() {
                eprintln!(
                    "recorder stop: no running session you may stop (looked in {})",
                    client::dirs_text()
                );
            }
            r
        }
        (None, false) => {
            let s = client::sessions();
            if s.len() == 1 {
                vec![(s[0].pid, client::stop(s[0].pid))]
            } else {
                eprintln!(
                    "recorder stop: {} sessions running: name a PID or give --all",
                    s.len()
                );
                return ExitCode::Runtime;
            }
        }
    };
    let mut code = ExitCode::Success;
    for (p, r) in results {
        match r {
            Ok(Stopped::Stopping) => eprintln!("session {p}: stopping"),
            Ok(Stopped::Exited) => eprintln!("session {p}: stopped (its process has exited)"),
            Ok(Stopped::Queued) => {
                eprintln!("session {p}: stopping (the session is busy; the stop request is queued)")
            }
            Err(e) => {
                eprintln!("recorder stop: {e}");
                code = ExitCode::Runtime;
            }
        }
    }
    code
}

/// Rotates one segmented session (the only one running, or `pid`), or
/// every one the caller may: 0 when each closed its segment, 1 otherwise
/// (a session that writes one file refuses, saying so).
pub(crate) fn rotate(pid: Option<u32>, all: bool) -> ExitCode {
    let results = match (pid, all) {
        (Some(p), _) => vec![(p, client::rotate(p))],
        (None, true) => {
            let r = client::rotate_all();
            if r.is_empty() {
                eprintln!(
                    "recorder rotate: no running session you may rotate (looked in {})",
                    client::dirs_text()
                );
                return ExitCode::Runtime;
            }
            r
        }
        (None, false) => {
            let s = client::sessions();
            if s.len() == 1 {
                vec![(s[0].pid, client::rotate(s[0].pid))]
            } else {
                eprintln!(
                    "recorder rotate: {} sessions running: name a PID or give --all",
                    s.len()
                );
                return ExitCode::Runtime;
            }
        }
    };
    let mut code = ExitCode::Success;
    for (p, r) in results {
        match r {
            Ok(()) => eprintln!("session {p}: segment closed, the next one opened"),
            Err(e) => {
                eprintln!("recorder rotate: {e}");
                code = ExitCode::Runtime;
            }
        }
    }
    code
}

/// Starts one `deferred_start` session (the only one running, or `pid`),
/// or every one the caller may start: 0 when each started, 1 otherwise.
pub(crate) fn start(pid: Option<u32>, all: bool) -> ExitCode {
    let me = rustix::process::geteuid().as_raw();
    let targets: Vec<u32> = match (pid, all) {
        (Some(p), _) => vec![p],
        (None, true) => client::sessions()
            .iter()
            .filter(|s| me == 0 || s.owner_uid == me)
            .map(|s| s.pid)
            .collect(),
        (None, false) => {
            let s = client::sessions();
            if s.len() == 1 {
                vec![s[0].pid]
            } else {
                eprintln!(
                    "recorder start: {} sessions running: name a PID or give --all",
                    s.len()
                );
                return ExitCode::Runtime;
            }
        }
    };
    let mut code = ExitCode::Success;
    for p in targets {
        match client::start(p) {
            Ok(()) => eprintln!("session {p}: started"),
            Err(e) => {
                eprintln!("recorder start: {e}");
                code = ExitCode::Runtime;
            }
        }
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_shows_each_uids_quota_hits_as_the_summary_words_them() {
        let s = SessionStatus {
            pid: 7,
            quotas: vec![
                UidQuotaStatus {
                    uid: 65534,
                    hits: vec![
                        ("connections_per_uid".into(), 1468),
                        ("held_bytes".into(), 12),
                    ],
                    ..UidQuotaStatus::default()
                },
                UidQuotaStatus {
                    uid: 1000,
                    hits: vec![("from_a_later_build\x1b".into(), 2)],
                    closed_producers: 3,
                    closed_packets: 40,
                    closed_bytes: 2048,
                },
            ],
            ..SessionStatus::default()
        };
        let t = status_text(&s);
        assert!(
            t.contains(
                "  producers of uid 65534: 1468 connections refused (too many of this uid), \
                 12 chunks or packets given up (bytes held for patches by this uid used up)\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "  producers of uid 1000: 3 more closed producers (40 packets, 2.0 KiB), \
                 2 from_a_later_build\\u{1b}\n"
            ),
            "{t}"
        );
    }
}

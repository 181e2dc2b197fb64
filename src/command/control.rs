//! `recorder trigger`, `query`, `stop` and `start`.

use crate::bytes::HumanBytes;
use crate::cli::{EXIT_OK, EXIT_RUNTIME};
use crate::control::client;
use crate::control::message::SessionStatus;

/// Fires `names` at every session; 0 when at least one session accepted
/// one of them, 1 otherwise, saying which.
pub fn fire(names: &[String], producer: &str) -> u8 {
    let results = match client::fire_triggers(names, producer) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("recorder trigger: {e}");
            return EXIT_RUNTIME;
        }
    };
    let mut any = false;
    for (pid, r) in results {
        match r {
            Ok(outcomes) => {
                for o in outcomes {
                    if o.accepted {
                        any = true;
                        eprintln!("session {pid}: trigger {:?} accepted", o.name);
                    } else {
                        let why = o.reason.unwrap_or_default();
                        eprintln!("session {pid}: trigger {:?} not taken ({why})", o.name);
                    }
                }
            }
            Err(e) => eprintln!("session {pid}: {e}"),
        }
    }
    if any {
        EXIT_OK
    } else {
        eprintln!("recorder trigger: no session accepted {}", names.join(", "));
        EXIT_RUNTIME
    }
}

/// Lists the live sessions.
pub fn query(json: bool) -> u8 {
    let all = client::query_all();
    if json {
        let items: Vec<serde_json::Value> = all
            .iter()
            .map(|(pid, r)| match r {
                Ok(s) => serde_json::to_value(s).unwrap_or_default(),
                Err(e) => serde_json::json!({ "pid": pid, "error": e }),
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return EXIT_OK;
    }
    if all.is_empty() {
        println!(
            "no running recorder sessions (looked in {})",
            client::dirs_text()
        );
        return EXIT_OK;
    }
    for (pid, r) in &all {
        match r {
            Ok(s) => print!("{}", status_text(s)),
            Err(e) => println!("session {pid}: {e}"),
        }
    }
    EXIT_OK
}

fn status_text(s: &SessionStatus) -> String {
    let mut t = format!(
        "session {} (uid {}): {}, {:.1} s, {} written to {}\n  config: {}\n",
        s.pid,
        s.uid,
        s.state,
        s.elapsed_ms as f64 / 1000.0,
        HumanBytes(s.bytes_written),
        s.output,
        s.config
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
            b.policy,
            HumanBytes(b.size_bytes),
            HumanBytes(b.bytes_written),
            HumanBytes(b.bytes_overwritten),
            HumanBytes(b.bytes_discarded),
            b.packets_lost
        ));
    }
    t
}

/// Stops one session, or all the caller may stop.
pub fn stop(pid: Option<u32>, all: bool) -> u8 {
    each_target("stop", pid, all, client::stop, "stopping")
}

/// Starts one `deferred_start` session, or all the caller may start.
pub fn start(pid: Option<u32>, all: bool) -> u8 {
    each_target("start", pid, all, client::start, "started")
}

/// Sends `what` to session `pid`, or to every session with `all`, or to the
/// only one running.
fn each_target(
    name: &str,
    pid: Option<u32>,
    all: bool,
    what: impl Fn(u32) -> Result<(), crate::control::ControlError>,
    done: &str,
) -> u8 {
    let targets: Vec<u32> = match (pid, all) {
        (Some(p), _) => vec![p],
        (None, true) => client::sessions().iter().map(|s| s.pid).collect(),
        (None, false) => {
            let s = client::sessions();
            if s.len() == 1 {
                vec![s[0].pid]
            } else {
                eprintln!(
                    "recorder {name}: {} sessions running: name a PID or give --all",
                    s.len()
                );
                return EXIT_RUNTIME;
            }
        }
    };
    let mut code = EXIT_OK;
    for p in targets {
        match what(p) {
            Ok(()) => eprintln!("session {p}: {done}"),
            Err(e) => {
                eprintln!("recorder {name}: {e}");
                code = EXIT_RUNTIME;
            }
        }
    }
    code
}

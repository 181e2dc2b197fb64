//! The client side: `recorder trigger`, `query` and `stop` find the live
//! sessions in the runtime directory and talk to them. Endpoints whose
//! process is gone are stale: they are removed where permitted and skipped.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ControlError;
use super::message::{self, Reply, Request, SessionStatus, TriggerOutcome};
use super::runtime_dir;
use super::server::endpoint_paths;

const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// One live session's endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionEndpoint {
    pub pid: u32,
    pub trigger: PathBuf,
    pub control: PathBuf,
}

fn pid_alive(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    // EPERM means it exists but belongs to someone else.
    !matches!(
        rustix::process::test_kill_process(p),
        Err(rustix::io::Errno::SRCH)
    )
}

/// The sessions listening in `dir`, with stale endpoints removed.
pub fn sessions_in(dir: &Path) -> Vec<SessionEndpoint> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("recorder-"))
            .and_then(|n| n.strip_suffix(".trigger"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let (trigger, control) = endpoint_paths(dir, pid);
        let refused = matches!(UnixStream::connect(&trigger), Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
        if !pid_alive(pid) || refused {
            log::debug!("removing stale endpoints of session {pid}");
            let _ = std::fs::remove_file(&trigger);
            let _ = std::fs::remove_file(&control);
            continue;
        }
        out.push(SessionEndpoint {
            pid,
            trigger,
            control,
        });
    }
    out.sort_by_key(|s| s.pid);
    out
}

/// The sessions in every candidate runtime directory.
pub fn sessions() -> Vec<SessionEndpoint> {
    runtime_dir::candidates()
        .iter()
        .flat_map(|d| sessions_in(d))
        .collect()
}

/// Sends one request to `path` and reads the reply.
pub fn request(path: &Path, pid: u32, req: &Request) -> Result<Reply, ControlError> {
    let sock = |source| ControlError::Socket {
        path: path.display().to_string(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(sock)?;
    s.set_read_timeout(Some(CLIENT_TIMEOUT)).map_err(sock)?;
    s.set_write_timeout(Some(CLIENT_TIMEOUT)).map_err(sock)?;
    s.write_all(&message::encode_request(req)).map_err(sock)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(sock)?;
    message::decode_reply(&buf).map_err(|msg| ControlError::BadReply { pid, msg })
}

/// Delivers `names` to every session; returns each session's outcomes.
/// Each session's answer: its pid and the outcome per name, or why it could not answer.
pub type TriggerResults = Vec<(u32, Result<Vec<TriggerOutcome>, String>)>;

pub fn fire_triggers(names: &[String], producer: &str) -> Result<TriggerResults, ControlError> {
    let all = sessions();
    if all.is_empty() {
        return Err(ControlError::NoSessions(dirs_text()));
    }
    let req = Request::Trigger {
        names: names.to_vec(),
        producer: producer.to_string(),
    };
    Ok(all
        .iter()
        .map(|s| {
            let r = match request(&s.trigger, s.pid, &req) {
                Ok(Reply::Triggers(o)) => Ok(o),
                Ok(Reply::Refused(m)) => Err(m),
                Ok(other) => Err(format!("unexpected reply {other:?}")),
                Err(e) => Err(e.to_string()),
            };
            (s.pid, r)
        })
        .collect())
}

/// Queries every session the caller may see.
pub fn query_all() -> Vec<(u32, Result<SessionStatus, String>)> {
    sessions()
        .iter()
        .map(|s| {
            let r = match request(&s.control, s.pid, &Request::Query {}) {
                Ok(Reply::Status(st)) => Ok(st),
                Ok(Reply::Refused(m)) => Err(m),
                Ok(other) => Err(format!("unexpected reply {other:?}")),
                Err(e) => Err(e.to_string()),
            };
            (s.pid, r)
        })
        .collect()
}

/// Asks session `pid` to stop gracefully.
pub fn stop(pid: u32) -> Result<(), ControlError> {
    expect(pid, &Request::Stop {}, |r| matches!(r, Reply::Stopping))
}

/// Asks `deferred_start` session `pid` to start.
pub fn start(pid: u32) -> Result<(), ControlError> {
    expect(pid, &Request::Start {}, |r| matches!(r, Reply::Started))
}

/// Sends `req` to session `pid`'s control socket; `ok` recognises success.
fn expect(pid: u32, req: &Request, ok: impl Fn(&Reply) -> bool) -> Result<(), ControlError> {
    let Some(s) = sessions().into_iter().find(|s| s.pid == pid) else {
        return Err(ControlError::Session {
            pid,
            msg: "no such running session".into(),
        });
    };
    match request(&s.control, pid, req)? {
        r if ok(&r) => Ok(()),
        Reply::Refused(msg) => Err(ControlError::Session { pid, msg }),
        other => Err(ControlError::BadReply {
            pid,
            msg: format!("{other:?}"),
        }),
    }
}

/// The runtime directories searched, for messages.
pub fn dirs_text() -> String {
    runtime_dir::candidates()
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(" or ")
}

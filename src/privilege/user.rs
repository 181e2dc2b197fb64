//! Which unprivileged user a root session becomes after its set-up.
//!
//! `RECORDER_USER` names it (a user name or a uid; `root` keeps root and
//! does not drop). Otherwise: the `recorder` system user when /etc/passwd
//! has one (a package creates it: `useradd --system recorder`), else a uid
//! of systemd's dynamic-user range (61184–65519) that nothing uses: neither
//! /etc/passwd nor /etc/group allocates it, systemd has not handed it out
//! (`/run/systemd/dynamic-uid`), no process runs with it (any of its uids
//! or gids), no entry of `/tmp`, `/var/tmp`, `/dev/shm` or the runtime
//! directory belongs to it — and no other session holds it: the session
//! takes `/run/recorder-uid/N.lock` (flock; one place for every session,
//! writable by root alone) and holds it for its whole life (the broker,
//! forked after, keeps it until its clean-up ends).
//! Never uid 0 and never 65534 (`nobody`): every other unprivileged process
//! running as that user could then signal or ptrace the recorder.

/// The environment variable that chooses the user.
pub(crate) const ENV: &str = "RECORDER_USER";
/// The system user looked up first.
pub(crate) const DEFAULT_NAME: &str = "recorder";
/// systemd's dynamic-user range.
pub(crate) const DYNAMIC: std::ops::RangeInclusive<u32> = 61184..=65519;
const NOBODY: u32 = 65534;

/// No service user could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UserError {
    #[error("{ENV}: uid/gid 0 is root; say {ENV}=root to keep root")]
    Root,
    #[error(
        "{ENV}: uid 65534 (nobody) is shared by other unprivileged processes, which could then signal or trace the recorder: choose a dedicated user"
    )]
    Nobody,
    #[error("root is not an unprivileged user")]
    NotUnprivileged,
    #[error("{ENV}={spec}: no such user in /etc/passwd, and not a uid")]
    Unknown {
        spec: String,
        #[source]
        cause: std::num::ParseIntError,
    },
    #[error(
        "no unused uid left in 61184-65519: set RECORDER_USER (or create the recorder system user)"
    )]
    RangeFull,
}

/// The user the recorder runs as after the drop.
#[derive(Debug, Clone)]
pub(crate) struct ServiceUser {
    pub uid: u32,
    pub gid: u32,
    /// How it was chosen, for the log.
    pub why: String,
    /// The lock that keeps a uid of the dynamic range this session's
    /// (`/run/recorder-uid/N.lock`, flock'd); held as long as a copy of
    /// this descriptor is open.
    pub hold: Option<std::sync::Arc<std::fs::File>>,
}

impl PartialEq for ServiceUser {
    fn eq(&self, o: &Self) -> bool {
        (self.uid, self.gid, &self.why) == (o.uid, o.gid, &o.why)
    }
}

impl Eq for ServiceUser {}

/// `Ok(None)`: stay root (`RECORDER_USER=root`). A uid of the dynamic range
/// comes with its lock held ([`ServiceUser::hold`]).
pub(crate) fn choose() -> Result<Option<ServiceUser>, UserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let env = std::env::var(ENV).ok().filter(|v| !v.is_empty());
    let in_use = InUse::now();
    let mut skip = Vec::new();
    loop {
        let chosen = choose_avoiding(env.as_deref(), &passwd, &group, &|id| {
            skip.contains(&id) || in_use.has(id)
        })?;
        let Some(mut u) = chosen.map(checked).transpose()? else {
            return Ok(None);
        };
        if !u.why.starts_with(DYNAMIC_WHY) {
            return Ok(Some(u));
        }
        match hold(u.uid) {
            Ok(Some(lock)) => {
                u.hold = Some(std::sync::Arc::new(lock));
                return Ok(Some(u));
            }
            // Another session holds it: the next one.
            Ok(None) => skip.push(u.uid),
            Err(e) => {
                log::warn!("uid {}: cannot hold it for this session ({e})", u.uid);
                return Ok(Some(u));
            }
        }
    }
}

/// How a uid of the dynamic range is described.
const DYNAMIC_WHY: &str = "an unused uid of the dynamic-user range";

/// Where the uids' locks are: one place for the whole machine (whatever
/// runtime directory a session uses), writable by root alone.
pub(crate) const LOCK_DIR: &str = "/run/recorder-uid";

/// Takes `LOCK_DIR/N.lock`; `None` when another session holds it.
fn hold(uid: u32) -> std::io::Result<Option<std::fs::File>> {
    use rustix::fs::{FileType, FlockOperation, Mode, OFlags, flock};
    let dir = crate::storage::create::OutputDir::create(std::path::Path::new(LOCK_DIR))
        .map_err(std::io::Error::other)?;
    let fd = rustix::fs::openat(
        dir.fd(),
        format!("{uid}.lock").as_str(),
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(std::io::Error::other("not a regular file"));
    }
    let f = std::fs::File::from(fd);
    match flock(&f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The ids something on the machine uses now: processes' uids and gids,
/// owners of the entries of the shared temporary directories and the
/// runtime directory, and the uids systemd handed out.
#[derive(Default)]
struct InUse(std::collections::HashSet<u32>);

impl InUse {
    fn now() -> Self {
        let mut ids = std::collections::HashSet::new();
        for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(status) = std::fs::read_to_string(p.path().join("status")) else {
                continue;
            };
            for l in status.lines() {
                if let Some(v) = l.strip_prefix("Uid:").or_else(|| l.strip_prefix("Gid:")) {
                    ids.extend(v.split_whitespace().filter_map(|n| n.parse::<u32>().ok()));
                }
            }
        }
        let runtime = crate::control::runtime_dir::candidates();
        let dirs = ["/tmp", "/var/tmp", "/dev/shm"]
            .iter()
            .map(std::path::PathBuf::from)
            .chain(runtime);
        for d in dirs {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if let Ok(m) = e.metadata() {
                    use std::os::unix::fs::MetadataExt;
                    ids.insert(m.uid());
                    ids.insert(m.gid());
                }
            }
        }
        // systemd's own dynamic users: one entry per uid it handed out.
        for e in std::fs::read_dir("/run/systemd/dynamic-uid")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Ok(id) = name.trim_start_matches("direct:").parse::<u32>() {
                ids.insert(id);
            }
        }
        Self(ids)
    }

    fn has(&self, id: u32) -> bool {
        self.0.contains(&id)
    }
}

fn checked(u: ServiceUser) -> Result<ServiceUser, UserError> {
    if u.uid == 0 || u.gid == 0 {
        return Err(UserError::Root);
    }
    if u.uid == NOBODY {
        return Err(UserError::Nobody);
    }
    Ok(u)
}

/// The user `spec` names (a name in /etc/passwd or a uid), with the same
/// refusals as [`choose`] (`recorder serve --user`).
pub(crate) fn named(spec: &str) -> Result<ServiceUser, UserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    match choose_from(Some(spec), &passwd, "") {
        Ok(Some(u)) => checked(u),
        Ok(None) => Err(UserError::NotUnprivileged),
        Err(e) => Err(e),
    }
}

/// The choice from `RECORDER_USER` and the two files' contents.
pub(crate) fn choose_from(
    env: Option<&str>,
    passwd: &str,
    group: &str,
) -> Result<Option<ServiceUser>, UserError> {
    choose_avoiding(env, passwd, group, &|_| false)
}

/// As [`choose_from`], a uid of the dynamic range `used` says is taken
/// left out.
fn choose_avoiding(
    env: Option<&str>,
    passwd: &str,
    group: &str,
    used: &dyn Fn(u32) -> bool,
) -> Result<Option<ServiceUser>, UserError> {
    let entries = parse(passwd);
    match env {
        Some("root") => Ok(None),
        Some(v) => {
            if let Some((_, uid, gid)) = entries.iter().find(|(n, _, _)| n == v) {
                return Ok(Some(ServiceUser {
                    uid: *uid,
                    gid: *gid,
                    why: format!("{ENV}={v}"),
                    hold: None,
                }));
            }
            let uid: u32 = v.parse().map_err(|cause| UserError::Unknown {
                spec: v.to_string(),
                cause,
            })?;
            let gid = entries
                .iter()
                .find(|(_, u, _)| *u == uid)
                .map_or(uid, |(_, _, g)| *g);
            Ok(Some(ServiceUser {
                uid,
                gid,
                why: format!("{ENV}={v}"),
                hold: None,
            }))
        }
        None => {
            if let Some((_, uid, gid)) = entries.iter().find(|(n, _, _)| n == DEFAULT_NAME) {
                return Ok(Some(ServiceUser {
                    uid: *uid,
                    gid: *gid,
                    why: format!("the {DEFAULT_NAME} system user"),
                    hold: None,
                }));
            }
            let gids: Vec<u32> = parse(group).iter().map(|(_, g, _)| *g).collect();
            DYNAMIC
                .into_iter()
                .find(|id| {
                    *id != NOBODY
                        && !entries.iter().any(|(_, u, _)| u == id)
                        && !gids.contains(id)
                        && !used(*id)
                })
                .map(|id| {
                    Some(ServiceUser {
                        uid: id,
                        gid: id,
                        why: DYNAMIC_WHY.into(),
                        hold: None,
                    })
                })
                .ok_or(UserError::RangeFull)
        }
    }
}

/// (name, 3rd field, 4th field) of each line of a passwd- or group-like
/// file (for /etc/group the 3rd field is the gid).
fn parse(text: &str) -> Vec<(String, u32, u32)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let id = f.get(2)?.parse().ok()?;
            let second = f.get(3).and_then(|g| g.parse().ok()).unwrap_or(id);
            Some((f.first()?.to_string(), id, second))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\ndyn:x:61184:61184::/:/bin/false\n";
    const GROUP: &str = "root:x:0:\nsixty:x:61185:\n";

    #[test]
    fn the_dynamic_range_skips_allocated_ids() {
        let u = choose_from(None, PASSWD, GROUP).expect("ok").expect("some");
        assert_eq!((u.uid, u.gid), (61186, 61186));
    }

    #[test]
    fn a_recorder_user_and_the_environment_win() {
        let p = format!("{PASSWD}recorder:x:990:985::/:/bin/false\n");
        let u = choose_from(None, &p, GROUP).expect("ok").expect("some");
        assert_eq!((u.uid, u.gid), (990, 985));
        let u = choose_from(Some("dyn"), &p, GROUP)
            .expect("ok")
            .expect("some");
        assert_eq!(u.uid, 61184);
        let u = choose_from(Some("4242"), &p, GROUP)
            .expect("ok")
            .expect("some");
        assert_eq!((u.uid, u.gid), (4242, 4242));
        assert_eq!(choose_from(Some("root"), &p, GROUP), Ok(None));
        assert!(matches!(
            choose_from(Some("no-such"), &p, GROUP),
            Err(UserError::Unknown { .. })
        ));
    }

    #[test]
    fn uids_in_use_are_left_out() {
        let used = |id: u32| id == 61186 || id == 61187;
        let u = choose_avoiding(None, PASSWD, GROUP, &used)
            .expect("ok")
            .expect("some");
        assert_eq!(u.uid, 61188);
        // A process of this test runs as root: root is in use; a free
        // dynamic uid is not (unless a process or file of it exists).
        let now = InUse::now();
        assert!(now.has(0));
    }

    #[test]
    fn root_and_nobody_are_refused() {
        assert_eq!(
            checked(ServiceUser {
                uid: 0,
                gid: 5,
                why: String::new(),
                hold: None,
            }),
            Err(UserError::Root)
        );
        assert_eq!(
            checked(ServiceUser {
                uid: 65534,
                gid: 65534,
                why: String::new(),
                hold: None,
            }),
            Err(UserError::Nobody)
        );
    }
}

//! Which unprivileged user a root session becomes after its set-up.
//!
//! `RECORDER_USER` names it (a user name or a uid; `root` keeps root and
//! does not drop). Otherwise: the `recorder` system user when /etc/passwd
//! has one, else the first uid of systemd's dynamic-user range
//! (61184–65519) that neither /etc/passwd nor /etc/group allocates. Never
//! uid 0 and never 65534 (`nobody`): every other unprivileged process
//! running as that user could then signal or ptrace the recorder.

/// The environment variable that chooses the user.
pub const ENV: &str = "RECORDER_USER";
/// The system user looked up first.
pub const DEFAULT_NAME: &str = "recorder";
/// systemd's dynamic-user range.
pub const DYNAMIC: std::ops::RangeInclusive<u32> = 61184..=65519;
const NOBODY: u32 = 65534;

/// No service user could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
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
    #[error("no unallocated uid left in 61184-65519: set RECORDER_USER")]
    RangeFull,
}

/// The user the recorder runs as after the drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUser {
    pub uid: u32,
    pub gid: u32,
    /// How it was chosen, for the log.
    pub why: String,
}

/// `Ok(None)`: stay root (`RECORDER_USER=root`).
pub fn choose() -> Result<Option<ServiceUser>, UserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let env = std::env::var(ENV).ok().filter(|v| !v.is_empty());
    choose_from(env.as_deref(), &passwd, &group)
        .map(|u| u.map(checked))
        .and_then(|u| u.transpose())
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
pub fn named(spec: &str) -> Result<ServiceUser, UserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    match choose_from(Some(spec), &passwd, "") {
        Ok(Some(u)) => checked(u),
        Ok(None) => Err(UserError::NotUnprivileged),
        Err(e) => Err(e),
    }
}

/// The choice from `RECORDER_USER` and the two files' contents.
pub fn choose_from(
    env: Option<&str>,
    passwd: &str,
    group: &str,
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
            }))
        }
        None => {
            if let Some((_, uid, gid)) = entries.iter().find(|(n, _, _)| n == DEFAULT_NAME) {
                return Ok(Some(ServiceUser {
                    uid: *uid,
                    gid: *gid,
                    why: format!("the {DEFAULT_NAME} system user"),
                }));
            }
            let gids: Vec<u32> = parse(group).iter().map(|(_, g, _)| *g).collect();
            DYNAMIC
                .into_iter()
                .find(|id| {
                    *id != NOBODY && !entries.iter().any(|(_, u, _)| u == id) && !gids.contains(id)
                })
                .map(|id| {
                    Some(ServiceUser {
                        uid: id,
                        gid: id,
                        why: "an unallocated uid of the dynamic-user range".into(),
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
    fn root_and_nobody_are_refused() {
        assert_eq!(
            checked(ServiceUser {
                uid: 0,
                gid: 5,
                why: String::new()
            }),
            Err(UserError::Root)
        );
        assert_eq!(
            checked(ServiceUser {
                uid: 65534,
                gid: 65534,
                why: String::new()
            }),
            Err(UserError::Nobody)
        );
    }
}

//! Dropping root for good: `recorder serve` binds its sockets as root, then
//! becomes an unprivileged service user, with no capabilities and
//! `no_new_privs`, before it reads a byte a client sends.
//!
//! Invariants:
//! - U1 [`drop_to`] runs before the process starts a thread: glibc's set*id
//!   wrappers change every thread, but nothing may run as root meanwhile.
//! - U2 Each call takes integers, or a null pointer with a zero count
//!   (`setgroups`); nothing it reads outlives the call.

use std::io::Error;

/// The uid of `nobody`: the attacker's uid in our tests and the shared uid
/// of unrelated daemons, never a service's own.
pub const NOBODY: u32 = 65534;
/// The service user when `--user` is not given.
pub const DEFAULT_USER: &str = "recorder";

/// Who the service becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Why the service cannot become its user.
#[derive(Debug, thiserror::Error)]
pub enum ServiceUserError {
    #[error(
        "no user {0:?} in /etc/passwd: create it (useradd --system {0}) or give --user NAME|UID"
    )]
    Unknown(String),
    #[error("the service user cannot be root (uid 0)")]
    Root,
    #[error(
        "uid {NOBODY} (nobody) cannot be the service user: it is shared by unrelated processes; give a user of its own"
    )]
    Nobody,
    #[error("/etc/passwd")]
    Passwd(#[source] Error),
    #[error("{call}")]
    Call {
        call: &'static str,
        #[source]
        source: Error,
    },
    #[error("privileges remain after the drop: {0}")]
    Remains(String),
}

/// `NAME` from /etc/passwd, or a numeric uid (its passwd group, else a
/// group of the same number).
pub fn resolve(spec: &str) -> Result<ServiceUser, ServiceUserError> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(ServiceUserError::Passwd)?;
    let entries = passwd.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        Some((
            *f.first()?,
            f.get(2)?.parse::<u32>().ok()?,
            f.get(3)?.parse::<u32>().ok()?,
        ))
    });
    let user = match spec.parse::<u32>() {
        Ok(uid) => {
            let found = entries.into_iter().find(|e| e.1 == uid);
            ServiceUser {
                name: found.map_or_else(|| uid.to_string(), |e| e.0.to_string()),
                uid,
                gid: found.map_or(uid, |e| e.2),
            }
        }
        Err(_) => {
            let mut entries = entries;
            let e = entries
                .find(|e| e.0 == spec)
                .ok_or_else(|| ServiceUserError::Unknown(spec.to_string()))?;
            ServiceUser {
                name: e.0.to_string(),
                uid: e.1,
                gid: e.2,
            }
        }
    };
    match user.uid {
        0 => Err(ServiceUserError::Root),
        NOBODY => Err(ServiceUserError::Nobody),
        _ if user.gid == 0 => Err(ServiceUserError::Root),
        _ => Ok(user),
    }
}

/// Becomes `user` for good: the capability bounding set emptied, the
/// supplementary groups cleared, real, effective and saved gid and uid
/// set, `no_new_privs` on; then checks that no uid 0 and no capability
/// is left.
pub fn drop_to(user: &ServiceUser) -> Result<(), ServiceUserError> {
    let call = |call: &'static str, r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(ServiceUserError::Call {
                call,
                source: Error::last_os_error(),
            })
        }
    };
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(63);
    for cap in 0..=last_cap {
        // SAFETY: U2 — integers only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        call("prctl(PR_CAPBSET_DROP)", r)?;
    }
    // SAFETY: U1, U2 — a zero count and a null list.
    call("setgroups", unsafe { libc::setgroups(0, std::ptr::null()) })?;
    // SAFETY: U1, U2 — integers only.
    call("setresgid", unsafe {
        libc::setresgid(user.gid, user.gid, user.gid)
    })?;
    // SAFETY: U1, U2 — integers only. With every uid non-zero the kernel
    // clears the permitted, effective and ambient capabilities.
    call("setresuid", unsafe {
        libc::setresuid(user.uid, user.uid, user.uid)
    })?;
    rustix::thread::set_no_new_privs(true).map_err(|e| ServiceUserError::Call {
        call: "prctl(PR_SET_NO_NEW_PRIVS)",
        source: e.into(),
    })?;
    check_dropped(user.uid)
}

/// Fails unless every uid is `uid` and the process holds no capability.
fn check_dropped(uid: u32) -> Result<(), ServiceUserError> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|e| ServiceUserError::Call {
            call: "reading /proc/self/status",
            source: e,
        })?;
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Uid" | "Gid" if value.split_whitespace().any(|v| v == "0") => {
                return Err(ServiceUserError::Remains(format!("{key}: {value}")));
            }
            "Uid" if value.split_whitespace().any(|v| v != uid.to_string()) => {
                return Err(ServiceUserError::Remains(format!("{key}: {value}")));
            }
            "CapInh" | "CapPrm" | "CapEff" | "CapAmb"
                if !value.trim_start_matches('0').is_empty() =>
            {
                return Err(ServiceUserError::Remains(format!("{key}: {value}")));
            }
            "NoNewPrivs" if value != "1" => {
                return Err(ServiceUserError::Remains(format!("{key}: {value}")));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_nobody_are_refused() {
        assert!(matches!(resolve("0"), Err(ServiceUserError::Root)));
        assert!(matches!(resolve("65534"), Err(ServiceUserError::Nobody)));
        assert!(matches!(
            resolve("no-such-user-here"),
            Err(ServiceUserError::Unknown(_))
        ));
    }

    #[test]
    fn a_numeric_uid_without_an_entry_gets_its_own_group() {
        let u = resolve("64123").expect("a free uid");
        assert_eq!((u.uid, u.gid), (64123, 64123));
    }
}

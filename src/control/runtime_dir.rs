//! The machine-wide runtime directory where sessions keep their sockets and
//! the trigger history: `$RECORDER_RUNTIME_DIR` if set, else `/run/recorder`
//! (where it exists or root can create it), else `/tmp/recorder`. It is one
//! place for every user (mode 1777, like `/tmp`): a per-user directory would
//! hide a root session from an unprivileged `recorder trigger`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::ControlError;

/// The environment variable that overrides the runtime directory.
pub const ENV: &str = "RECORDER_RUNTIME_DIR";
const SYSTEM: &str = "/run/recorder";
const FALLBACK: &str = "/tmp/recorder";

/// The directories a client looks in, in order.
pub fn candidates() -> Vec<PathBuf> {
    match std::env::var_os(ENV) {
        Some(d) if !d.is_empty() => vec![PathBuf::from(d)],
        _ => vec![PathBuf::from(SYSTEM), PathBuf::from(FALLBACK)],
    }
}

/// The directory a new session listens in, created (mode 1777) if needed.
pub fn for_server() -> Result<PathBuf, ControlError> {
    let cands = candidates();
    let mut last_err = None;
    for dir in &cands {
        match ensure(dir) {
            Ok(()) => return Ok(dir.clone()),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| ControlError::RuntimeDir {
        path: String::new(),
        source: std::io::Error::other("no runtime directory candidate"),
    }))
}

fn ensure(dir: &Path) -> Result<(), ControlError> {
    let err = |source| ControlError::RuntimeDir {
        path: dir.display().to_string(),
        source,
    };
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(err)?;
        // World-writable and sticky: any user's session may add its sockets,
        // none may remove another's.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).map_err(err)?;
    }
    // Writable by us? (An unprivileged user may find a root-made 0755 dir.)
    rustix::fs::access(
        dir,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )
    .map_err(|e| err(e.into()))?;
    Ok(())
}

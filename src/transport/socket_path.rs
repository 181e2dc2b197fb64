//! Where the producer socket lives and how it is claimed.
//!
//! An unmodified SDK app looks for the service at
//! `/run/perfetto/traced-producer.sock` when `/run/perfetto/` is searchable,
//! else at `/tmp/perfetto-producer`; `PERFETTO_PRODUCER_SOCK_NAME` overrides
//! both (ARCHITECTURE.md §9.1). The recorder listens where the app looks, and
//! `--producer-socket PATH` overrides everything.
//!
//! Whether the socket opens at all is decided first ([`decide`]): closed by
//! default, it opens only for a session that needs apps — its config names a
//! data source no built-in source provides, or `--producer-socket` is given
//! (or, later, a long-lived service asks for it: [`Reason::Serve`]).
//! `PERFETTO_PRODUCER_SOCK_NAME` says *where*, never *whether*. So a path
//! another user squats cannot affect a session of built-in sources.
//!
//! Once open, anyone may connect, as with Perfetto's service (mode 0666):
//! producers of every user record into the session, each tagged with its own
//! uid and pid from the socket, within per-uid quotas (`producer::quota`). A path
//! held by a live listener (Perfetto's own service, another recorder) is
//! refused; a stale socket file is replaced.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The environment variable SDK apps read.
pub(crate) const ENV_VAR: &str = "PERFETTO_PRODUCER_SOCK_NAME";
/// The directory Perfetto's service uses where it exists.
pub(crate) const RUN_DIR: &str = "/run/perfetto/";
/// The socket in [`RUN_DIR`].
pub(crate) const RUN_SOCKET: &str = "/run/perfetto/traced-producer.sock";
/// The fallback.
pub(crate) const TMP_SOCKET: &str = "/tmp/perfetto-producer";

/// Errors of claiming the socket path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketPathError {
    #[error(
        "{path} is held by a live listener (Perfetto's traced or another recorder): stop it, \
         or listen elsewhere with --producer-socket PATH (and point the apps there with \
         {ENV_VAR}=PATH)"
    )]
    InUse { path: PathBuf },
    #[error("{path} exists and is not a socket: not replacing it")]
    NotASocket { path: PathBuf },
    #[error("cannot listen on {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("an abstract or network producer socket ({0}) is not supported: give a path")]
    NotAPath(String),
}

/// Why a session opens the producer socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// `--producer-socket PATH`.
    Flag,
    /// The config names data sources only apps provide (their names).
    AppSources(Vec<String>),
    /// A long-lived service that serves apps whatever its sessions name.
    Serve,
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Flag => f.write_str("--producer-socket is given"),
            Reason::AppSources(names) => {
                write!(f, "the config names data sources only apps provide: ")?;
                for (i, n) in names.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{n:?}")?;
                }
                Ok(())
            }
            Reason::Serve => f.write_str("the service serves apps"),
        }
    }
}

/// Whether the producer socket opens, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// No app can connect; nothing is claimed on the file system.
    Closed,
    Open {
        path: PathBuf,
        reason: Reason,
    },
}

/// Closed by default: open only when `--producer-socket` is given
/// (`flag`), the config names data sources no built-in source provides
/// (`app_sources`), or `serve` says so. The environment (`env`, the value
/// of [`ENV_VAR`]) only chooses the path of a socket that opens.
pub(crate) fn decide(
    flag: Option<&Path>,
    env: Option<&str>,
    app_sources: &[String],
    serve: bool,
) -> Result<Opening, SocketPathError> {
    let reason = if flag.is_some() {
        Reason::Flag
    } else if !app_sources.is_empty() {
        Reason::AppSources(app_sources.to_vec())
    } else if serve {
        Reason::Serve
    } else {
        return Ok(Opening::Closed);
    };
    Ok(Opening::Open {
        path: resolve(flag, env)?,
        reason,
    })
}

/// The path to listen on: the flag, else the environment, else where an SDK
/// app looks by default on this machine.
pub(crate) fn resolve(flag: Option<&Path>, env: Option<&str>) -> Result<PathBuf, SocketPathError> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    if let Some(e) = env.filter(|e| !e.is_empty()) {
        // SDK apps use the value verbatim; only a plain path works for both.
        if e.starts_with('@') || e.starts_with("vsock://") || e.contains(',') {
            return Err(SocketPathError::NotAPath(e.to_string()));
        }
        return Ok(PathBuf::from(e));
    }
    let run_ok = rustix::fs::access(RUN_DIR, rustix::fs::Access::EXEC_OK).is_ok();
    Ok(PathBuf::from(if run_ok { RUN_SOCKET } else { TMP_SOCKET }))
}

/// Binds `path` for any local user, replacing a stale socket and refusing
/// a live one.
pub(crate) fn claim(path: &Path) -> Result<UnixListener, SocketPathError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(SocketPathError::InUse {
                    path: path.to_path_buf(),
                });
            }
            log::info!("replacing the stale producer socket {}", path.display());
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => {
            return Err(SocketPathError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SocketPathError::Bind {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    let bind_err = |source| SocketPathError::Bind {
        path: path.to_path_buf(),
        source,
    };
    // A waiting SDK app connects the moment the name appears (it watches
    // the directory for IN_CREATE), so the name must appear only once the
    // socket listens: bind and listen under a private name, then link it.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(bind_err)?;
    let published = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666))
        .and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    published.map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_then_the_environment_then_the_default() {
        let flag = Path::new("/x/flag.sock");
        assert_eq!(resolve(Some(flag), Some("/y")).expect("ok"), flag);
        assert_eq!(
            resolve(None, Some("/y/env.sock")).expect("ok"),
            Path::new("/y/env.sock")
        );
        let d = resolve(None, None).expect("ok");
        assert!(d == Path::new(RUN_SOCKET) || d == Path::new(TMP_SOCKET));
        assert!(resolve(None, Some("@abstract")).is_err());
        assert!(resolve(None, Some("/a,/b")).is_err());
    }

    #[test]
    fn the_socket_stays_closed_unless_apps_are_needed_or_it_is_asked_for() {
        let none: &[String] = &[];
        // The environment alone opens nothing.
        assert_eq!(
            decide(None, Some("/y/env.sock"), none, false).expect("ok"),
            Opening::Closed
        );
        assert_eq!(
            decide(Some(Path::new("/f")), None, none, false).expect("ok"),
            Opening::Open {
                path: "/f".into(),
                reason: Reason::Flag
            }
        );
        let apps = vec!["track_event".to_string()];
        assert_eq!(
            decide(None, Some("/y/env.sock"), &apps, false).expect("ok"),
            Opening::Open {
                path: "/y/env.sock".into(),
                reason: Reason::AppSources(apps.clone())
            }
        );
        assert!(matches!(
            decide(None, None, none, true).expect("ok"),
            Opening::Open {
                reason: Reason::Serve,
                ..
            }
        ));
        // A bad environment value matters only when the socket opens.
        assert_eq!(
            decide(None, Some("@abstract"), none, false).expect("ok"),
            Opening::Closed
        );
        assert!(decide(None, Some("@abstract"), &apps, false).is_err());
    }

    #[test]
    fn a_live_listener_is_refused_and_a_stale_socket_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.sock");
        let live = claim(&path).expect("first claim");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        let err = claim(&path).expect_err("held");
        assert!(err.to_string().contains("--producer-socket"), "{err}");
        drop(live);
        // The file stays behind with nobody listening: stale.
        claim(&path).expect("stale socket replaced");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        assert!(matches!(
            claim(&file),
            Err(SocketPathError::NotASocket { .. })
        ));
    }
}

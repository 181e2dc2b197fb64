//! Other users: commands run as an unprivileged uid (`setpriv`), and the
//! hostile peer of `tests/attacker/hostile_peer.py` playing one.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::repo_root;

pub const NOBODY: &str = "65534";

/// [`NOBODY`] as a number.
pub const NOBODY_UID: u32 = 65534;

pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// `program` run as uid `uid` (no groups).
pub fn as_user(uid: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", uid, "--regid", uid, "--clear-groups"])
        .arg(program)
        .stdin(Stdio::null());
    c
}

pub fn as_nobody(program: impl AsRef<std::ffi::OsStr>) -> Command {
    as_user(NOBODY, program)
}

/// A hostile peer (tests/attacker/hostile_peer.py) as nobody, once it says
/// it is ready. Killed when dropped.
pub struct Attacker(pub Child);

impl Attacker {
    pub fn start(args: &[&str]) -> Attacker {
        Attacker(start_as_nobody("hostile_peer.py", args))
    }
}

/// Starts `tests/attacker/SCRIPT ARGS` as nobody and returns once it says
/// `ready` (its stdout stays readable for what it reports next).
pub fn start_as_nobody(script: &str, args: &[&str]) -> Child {
    let script = repo_root().join("tests/attacker").join(script);
    let mut child = as_nobody(python())
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("attacker starts");
    let mut out = child.stdout.take().expect("stdout");
    let mut line = [0u8; 6];
    out.read_exact(&mut line).expect("attacker says ready");
    assert_eq!(&line, b"ready\n");
    child.stdout = Some(out);
    child
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An entry planted by uid 65534 at `path`: a symlink or a hard link to
/// `victim`, or a FIFO. Owned by nobody where the filesystem allows it,
/// as another user's would be.
pub fn plant(path: &Path, what: &str, victim: &Path) {
    match what {
        "symlink" => std::os::unix::fs::symlink(victim, path).expect("symlink"),
        "hardlink" => std::fs::hard_link(victim, path).expect("link"),
        "fifo" => rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o666),
            0,
        )
        .expect("mkfifo"),
        _ => unreachable!(),
    }
    let _ = rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(rustix::process::Uid::from_raw(NOBODY_UID)),
        Some(rustix::process::Gid::from_raw(NOBODY_UID)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    );
}

/// Runs shell `script` as nobody (planting what another user would) and
/// checks it succeeded, saying its stderr if not.
pub fn plant_as_nobody(script: &str) {
    let planted = as_nobody("sh").args(["-c", script]).output().expect("sh");
    assert!(
        planted.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&planted.stderr)
    );
}

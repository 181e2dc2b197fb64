//! Who is at the other end of a Unix socket: the uid and pid the kernel
//! says (`SO_PEERCRED`), never what the peer claims. Every port keys its
//! quotas and log budgets by that uid; tables kept per uid are bounded.

use std::os::fd::AsFd;

/// Uids accounted one by one; the ones after share [`OTHER_UIDS`].
pub const MAX_UIDS: usize = 1024;
/// The shared account of uids past [`MAX_UIDS`].
pub const OTHER_UIDS: u32 = u32::MAX;

/// A connected peer, as the kernel names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub uid: u32,
    pub pid: u32,
}

/// The peer of the connected socket `s`.
pub(crate) fn of(s: impl AsFd) -> std::io::Result<Peer> {
    let cred = rustix::net::sockopt::socket_peercred(s.as_fd())?;
    Ok(Peer {
        uid: cred.uid.as_raw(),
        pid: cred.pid.as_raw_nonzero().get() as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_pair_names_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let p = of(&a).expect("credentials");
        assert_eq!(p.pid, std::process::id());
        assert_eq!(p.uid, rustix::process::getuid().as_raw());
    }
}

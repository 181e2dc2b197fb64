//! The broker's message format: one request or reply per SOCK_SEQPACKET
//! datagram, JSON of the enums below, at most [`MAX_MESSAGE`] bytes, with at
//! most [`MAX_FDS`] descriptors beside it (SCM_RIGHTS). Versionless: both
//! ends are the same binary, forked from one process.

use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

use crate::sources::ftrace::Leftover;
use crate::sources::ftrace::remote::{FtraceRequest, PreparedInfo, RequestError};
use crate::sources::ftrace::tracefs::TracefsTeardown;
use crate::storage::segment::hook::HookCounts;

/// The largest datagram either side sends or accepts.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024;
/// Descriptors one datagram carries at most.
pub(crate) const MAX_FDS: usize = 64;

/// What the unprivileged process asks. The `Register*` requests and
/// `Seal` are accepted only before the drop; after `Seal`, only the
/// operations on what was registered.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    /// With a directory descriptor: files may be made there whose names
    /// start with one of `prefixes` (or `.` and a prefix: temporary names).
    /// `files`: the session's files already there (made before the drop);
    /// the broker acts on those and on the ones it makes, nothing else.
    RegisterDir {
        prefixes: Vec<String>,
        #[serde(default)]
        files: Vec<String>,
    },
    /// With a directory descriptor: the socket `name` there is removed when
    /// the session ends.
    RegisterLeftover {
        name: String,
    },
    /// With the runtime directory's descriptor: the session's
    /// `unique_session_name` lock file `name` there (holding the session's
    /// pid), removed at the end while the session still holds its lock.
    RegisterNameLock {
        name: String,
    },
    /// The recorder's pid (after it went to the background, if it did):
    /// the tracefs instances and kprobes named after it are swept at the
    /// end, also those it made before it could register their teardown.
    RegisterRecorder {
        pid: u32,
    },
    /// Tracefs changes to undo at the end.
    RegisterTeardown {
        teardown: TracefsTeardown,
    },
    /// With the memfd or ring file of buffer `index`: what it holds is
    /// saved if the recorder dies (`privilege::rescue`).
    RegisterRing {
        index: u32,
    },
    /// With the trace file's descriptor: where the buffers are saved if the
    /// recorder (`pid`) dies before it says it is done; `label` names the
    /// file for people.
    RegisterSaveTo {
        label: String,
        pid: u32,
    },
    /// With a segmented session's directory descriptor: the save is its
    /// next segment, named `STEM-NNNNNN.EXT` (`dir` names the directory
    /// for people).
    RegisterSaveToSegments {
        dir: PathBuf,
        stem: String,
        ext: String,
        pid: u32,
    },
    /// With the ring directory's descriptor: the session's ring files
    /// there, removed once what they hold is saved.
    RegisterRingFiles {
        names: Vec<String>,
    },
    /// A tracefs recording directory whose leftover the kernel still holds
    /// if the recorder dies: read into the save before the teardown.
    RegisterDrain {
        leftover: Leftover,
    },
    /// The `--on-segment-closed` command, run by the broker as root on the
    /// segments of registered directory `dir`.
    RegisterHook {
        command: String,
        dir: u32,
        /// Each run's process group is killed after this long.
        timeout_ms: u64,
    },
    /// No more registrations.
    Seal,
    Create {
        dir: u32,
        name: String,
        replace: bool,
    },
    Rename {
        dir: u32,
        from: String,
        to: String,
    },
    Remove {
        dir: u32,
        name: String,
    },
    /// A segment closed: run the hook on it.
    SegmentClosed {
        file: String,
        sidecar: String,
        index: u64,
    },
    HookCounts,
    /// Wait up to `grace_ms` for queued hooks, then report.
    FinishHooks {
        grace_ms: u64,
    },
    /// The session is done (its final pass written): nothing is to be
    /// saved when its end closes. Undo the tracefs changes and remove the
    /// leftovers now.
    Teardown,
    /// `recorder serve`'s broker only: a tracefs instance set up to
    /// `request` for a session of consumer `uid`, within that uid's limits.
    /// Answered by [`Reply::Ftrace`], one [`Reply::Format`] per event and
    /// [`Reply::Fds`] until every descriptor has come.
    PrepareFtrace {
        uid: u32,
        request: FtraceRequest,
    },
    /// Undo instance `key` (its user closed its descriptors).
    ReleaseFtrace {
        key: u64,
    },
    /// `recorder serve`'s broker only, at any time: with the memfd of
    /// buffer `index` of served session `session`, saved if the service
    /// dies while that session records.
    SaveServedRing {
        session: u64,
        index: u32,
    },
    /// With served session `session`'s trace file: where its buffers are
    /// saved if the service dies; `label` names it for people.
    SaveServedTo {
        session: u64,
        label: String,
    },
    /// Served session `session` records in the ftrace instance `leftover`
    /// names, which must be one this broker prepared and still holds: what
    /// the kernel holds there is read into the save before it is removed.
    SaveServedDrain {
        session: u64,
        leftover: Leftover,
    },
    /// Served session `session` wrote its last pass (or ends without one):
    /// nothing of it is to be saved.
    ServedSaved {
        session: u64,
    },
}

/// The broker's answer.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    Done,
    Registered(u32),
    /// A descriptor comes with it.
    File,
    /// The name is taken.
    Exists,
    Hooks {
        counts: HookCounts,
        last_error: Option<String>,
        /// Segments their command deleted or moved away.
        deleted: Vec<u64>,
    },
    Refused(Refusal),
    /// A prepared instance; its formats and descriptors follow.
    Ftrace {
        key: u64,
        /// Without its formats, which follow one per datagram.
        info: PreparedInfo,
        formats: usize,
    },
    /// One event format (group, name, text) of the instance.
    Format(String, String, String),
    /// Descriptors of the instance, in order.
    Fds,
}

/// Why the broker refused a request, as it crosses the wire: the service
/// tells a misuse of the protocol (only a broken or compromised recorder
/// sends one) from a limit of `recorder serve`'s ftrace instances and from
/// an operation the system refused (with its errno), and words each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("registrations are closed")]
    Sealed,
    #[error("not sealed yet")]
    NotSealed,
    #[error("this request is not answered here")]
    NotHere,
    /// serde's complaint in words: a refusal crosses the process boundary
    /// as text.
    #[error("a request the broker could not read: {0}")]
    Unreadable(String),
    #[error("no directory descriptor came with the request")]
    NoDescriptor,
    #[error("{0:?} is not a plain name")]
    NotPlainName(String),
    #[error("{0:?} is not a session name lock")]
    NotNameLock(String),
    #[error("no directory {0}")]
    NoDirectory(u32),
    #[error("{0:?} is not a name of this session")]
    NotOurs(String),
    #[error("{0:?} is not a file this session made (or no longer the one it made)")]
    NotMade(String),
    #[error("{from:?} is not to be renamed {to:?}")]
    NotItsName { from: String, to: String },
    #[error("{name:?} there is not a regular file")]
    NotAFile { name: String },
    #[error("no hook registered")]
    NoHook,
    #[error("no ftrace instance {0}")]
    NoInstance(u64),
    #[error("this broker prepares no ftrace")]
    NotServing,
    #[error("more than {0} buffers registered for saving")]
    TooManyRings(usize),
    #[error("more than {0} served sessions registered for saving")]
    TooManySaved(usize),
    #[error("served session {0} has no registered buffers")]
    NoSaved(u64),
    #[error("invalid request: {0}")]
    Invalid(#[source] RequestError),
    #[error("uid {uid} holds {held} ftrace instances, the most a uid may")]
    UidInstances { uid: u32, held: usize },
    #[error("{0} ftrace instances are held, the most the service may")]
    Instances(usize),
    #[error(
        "uid {uid}: {want} KiB of ftrace buffers over the {held} KiB held would pass its {max} KiB",
        max = super::broker::MAX_BUFFER_KB_PER_UID
    )]
    UidMemory { uid: u32, want: u64, held: u64 },
    /// The system refused what the broker did: the operation, the OS
    /// error number when there is one, and the failure in words.
    #[error("{op}: {detail}")]
    System {
        op: Operation,
        errno: Option<i32>,
        /// Text, as the refusal crosses the process boundary; `errno` is
        /// its typed part.
        detail: String,
    },
}

impl Refusal {
    /// `op` failed with `e`: its errno is the first OS error of its
    /// chain of causes.
    pub(crate) fn system(op: Operation, e: &(dyn std::error::Error + 'static)) -> Self {
        let mut errno = None;
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            if let Some(n) = c
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
                .or_else(|| {
                    c.downcast_ref::<rustix::io::Errno>()
                        .map(|e| e.raw_os_error())
                })
            {
                errno = Some(n);
                break;
            }
            cause = c.source();
        }
        Refusal::System {
            op,
            errno,
            detail: e.to_string(),
        }
    }

    /// A limit of `recorder serve`'s ftrace instances (the request may
    /// succeed once other sessions end), not a fault.
    #[cfg(test)]
    pub(crate) fn is_limit(&self) -> bool {
        matches!(
            self,
            Refusal::UidInstances { .. } | Refusal::Instances(_) | Refusal::UidMemory { .. }
        )
    }
}

/// What the broker tried when the system refused it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub(crate) enum Operation {
    #[error("registering the directory {0}")]
    RegisterDir(PathBuf),
    #[error("reading the name lock {0:?}")]
    ReadNameLock(String),
    #[error("starting the hook runner")]
    StartHooks,
    #[error("creating {0:?}")]
    Create(String),
    #[error("renaming {from:?} to {to:?}")]
    Rename { from: String, to: String },
    #[error("removing {0:?}")]
    Remove(String),
    #[error("preparing a tracefs instance")]
    PrepareFtrace,
}

/// A message that could not be sent or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MessageError {
    #[error("the other end is gone")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0} descriptors in one message (at most {MAX_FDS})")]
    TooManyFds(usize),
    #[error("message of {0} bytes is over the limit")]
    TooLarge(usize),
}

/// Sends `msg` (with `fd`) as one datagram.
pub(crate) fn send<T: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> Result<(), MessageError> {
    send_many(sock, msg, fd.as_slice())
}

/// Sends `msg` with up to [`MAX_FDS`] descriptors as one datagram.
pub(crate) fn send_many<T: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), MessageError> {
    let bytes = serde_json::to_vec(msg)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(MessageError::TooLarge(bytes.len()));
    }
    if fds.len() > MAX_FDS {
        return Err(MessageError::TooManyFds(fds.len()));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(fds));
    }
    loop {
        match rustix::net::sendmsg(
            sock,
            &[std::io::IoSlice::new(&bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => {
                return Err(MessageError::Closed);
            }
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
}

/// Receives one datagram: the message and the descriptor beside it, if
/// any (any further one is closed).
pub(crate) fn recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> Result<(T, Option<OwnedFd>), MessageError> {
    let (msg, fds) = recv_many(sock)?;
    Ok((msg, fds.into_iter().next()))
}

/// Receives one datagram with the descriptors beside it.
pub(crate) fn recv_many<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> Result<(T, Vec<OwnedFd>), MessageError> {
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = loop {
        match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => break r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::CONNRESET) => return Err(MessageError::Closed),
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    if r.bytes == 0 {
        return Err(MessageError::Closed);
    }
    if r.bytes > MAX_MESSAGE || r.flags.contains(rustix::net::ReturnFlags::TRUNC) {
        return Err(MessageError::TooLarge(r.bytes));
    }
    let msg = serde_json::from_slice(&buf[..r.bytes])?;
    Ok((msg, fds))
}

/// A connected pair of SOCK_SEQPACKET sockets (close-on-exec).
pub(crate) fn pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_request_and_a_descriptor_cross() {
        let (a, b) = pair().expect("pair");
        let f = tempfile::tempfile().expect("file");
        let req = Request::Create {
            dir: 3,
            name: "t-000001.pftrace.partial".into(),
            replace: false,
        };
        send(a.as_fd(), &req, Some(f.as_fd())).expect("send");
        let (got, fd): (Request, _) = recv(b.as_fd()).expect("recv");
        assert!(matches!(got, Request::Create { dir: 3, .. }));
        assert!(fd.is_some());
        drop(a);
        assert!(matches!(
            recv::<Request>(b.as_fd()),
            Err(MessageError::Closed)
        ));
    }

    #[test]
    fn many_descriptors_cross_in_one_datagram() {
        let (a, b) = pair().expect("pair");
        let files: Vec<std::fs::File> = (0..MAX_FDS)
            .map(|_| tempfile::tempfile().expect("file"))
            .collect();
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(AsFd::as_fd).collect();
        send_many(a.as_fd(), &Reply::Fds, &fds).expect("send");
        let (got, received): (Reply, _) = recv_many(b.as_fd()).expect("recv");
        assert!(matches!(got, Reply::Fds));
        assert_eq!(received.len(), MAX_FDS);
        let too_many: Vec<BorrowedFd<'_>> = fds.iter().chain(&fds[..1]).copied().collect();
        assert!(send_many(a.as_fd(), &Reply::Fds, &too_many).is_err());
    }

    #[test]
    fn a_refusal_crosses_typed_with_its_errno() {
        let (a, b) = pair().expect("pair");
        let denied = std::io::Error::from_raw_os_error(libc_eacces());
        let sent = [
            Refusal::UidInstances {
                uid: 65534,
                held: 4,
            },
            Refusal::system(Operation::Create("t-000001.pftrace".into()), &denied),
            Refusal::Invalid(RequestError::EventCount(0)),
        ];
        for r in &sent {
            send(a.as_fd(), &Reply::Refused(r.clone()), None).expect("send");
            let (got, _): (Reply, _) = recv(b.as_fd()).expect("recv");
            assert!(matches!(&got, Reply::Refused(g) if g == r), "{got:?}");
        }
        let Refusal::System { errno, .. } = &sent[1] else {
            panic!("{:?}", sent[1]);
        };
        assert_eq!(*errno, Some(libc_eacces()));
        assert!(sent[0].is_limit() && !sent[1].is_limit());
        assert_eq!(
            sent[1].to_string(),
            format!("creating \"t-000001.pftrace\": {denied}")
        );
    }

    fn libc_eacces() -> i32 {
        rustix::io::Errno::ACCESS.raw_os_error()
    }

    #[test]
    fn oversized_and_malformed_datagrams_are_refused() {
        let (a, b) = pair().expect("pair");
        rustix::net::send(&a, &vec![b'x'; MAX_MESSAGE + 10], SendFlags::empty()).expect("send");
        assert!(matches!(
            recv::<Request>(b.as_fd()),
            Err(MessageError::TooLarge(_))
        ));
        rustix::net::send(&a, b"{\"Nope\":1}", SendFlags::empty()).expect("send");
        assert!(matches!(
            recv::<Request>(b.as_fd()),
            Err(MessageError::Json(_))
        ));
    }
}

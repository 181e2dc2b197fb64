//! What a host and its sessions say to each other, in types: [`Command`]s
//! in (each with the host's [`Ticket`]), [`SessionEvent`]s out.

use std::os::fd::OwnedFd;

use crate::session::Answer;

/// The host's name for one of its requests, given back with the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Ticket(pub u64);

/// A host's request to a session.
#[derive(Debug)]
pub(crate) enum Command {
    /// Start a `deferred_start` session (StartTracing).
    Start,
    /// Stop it (DisableTracing, the client gone, the service stopping).
    Stop,
    /// Flush its sources; answered when the flush ended.
    Flush,
    /// A write pass now; answered once written (ReadBuffers of a running
    /// session).
    Drain,
    /// A flush, then a copy of its buffers into the descriptor.
    Clone(OwnedFd),
}

/// How a session answered a command.
#[derive(Debug)]
pub(crate) enum Response {
    /// The session's own answer.
    Session(Answer),
    /// A clone's copy: its bytes, or why there is none.
    Cloned(Result<u64, CloneError>),
}

/// Why a clone's copy was not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CloneError {
    #[error("no output for the clone")]
    NoOutput,
    #[error("clone output")]
    Output(#[source] crate::storage::StorageError),
    #[error("clone")]
    Write(#[source] crate::storage::write_pass::PassError),
}

/// What a session tells its host.
#[derive(Debug)]
pub(crate) enum SessionEvent {
    /// The answer to the command of `ticket`.
    Answered { ticket: Ticket, response: Response },
    /// Every data source started (producers' that promised to say so
    /// included): `all_data_sources_started`.
    AllDataSourcesStarted,
    /// A CLONE_SNAPSHOT trigger asked for a snapshot; the host's consumer
    /// clones the session.
    CloneTriggerHit { trigger: String },
}

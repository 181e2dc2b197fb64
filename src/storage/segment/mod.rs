//! Segmented output: one session written as numbered, self-contained
//! traces, each closed durably before the next is opened, kept within a
//! disk budget, and announced to a shipping command.
//!
//! ```text
//!  pass ─► SegmentWriter (FileSink) ─► DIR/t-000004.pftrace.partial   (being written)
//!  rotate: tail packets → fdatasync → rename → t-000004.pftrace
//!          → sidecar t-000004.pftrace.json (tmp, fdatasync, rename) → fsync DIR
//!          → budget: delete the oldest closed segments (never the open one)
//!          → hook thread: CMD DIR/t-000004.pftrace
//!          → open t-000005.pftrace.partial
//! ```
//!
//! The writer owns naming, the partial→final rename, sidecars, the budget
//! and the hook runner. What heads a segment (clock snapshots, config, uuid,
//! index) is [`crate::trace::service_log`]'s; when to cut is
//! [`policy::rotation_due`], a pure function the session calls after each
//! pass. A crash leaves every closed segment with its sidecar and the open
//! one as a valid trace under its `.partial` name (plus at most a torn
//! packet).

pub(crate) mod hook;
pub(crate) mod names;
pub(crate) mod policy;
pub(crate) mod sidecar;

use std::collections::{BTreeMap, VecDeque};
use std::io::IoSlice;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use self::hook::{HookCounts, HookJob, HookRunner};
use self::names::SegmentNames;
use self::policy::{RotateReason, RotationPolicy};
use self::sidecar::{SIDECAR_VERSION, SegmentLoss, Sidecar};
use super::create::{CreateError, OutputDir};
use super::write_pass::PassReport;
use super::{FileSink, OpenOptions, SinkError, SinkKind, StorageError, WriteList};
use crate::ringbuf::{Buffer, BufferStats};

/// How long the end of a session waits for queued `--on-segment-closed` commands.
pub(crate) const HOOK_GRACE: Duration = Duration::from_secs(10);

/// Segmented output failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SegmentError {
    #[error(
        "{dir} already holds segments of this name ({first}, …): move them or choose another output"
    )]
    Exists { dir: PathBuf, first: PathBuf },
    #[error("cannot create {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Open(#[from] StorageError),
    #[error("writing the segment failed: {0}")]
    Write(#[from] SinkError),
    #[error("closing {path} failed: {source}")]
    Close {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the --on-segment-closed thread: {0}")]
    Hook(#[source] std::io::Error),
    #[error(transparent)]
    Refused(#[from] CreateError),
    #[error("{dir}: {tried} names in a row were already taken by other entries; giving up")]
    NamesTaken { dir: PathBuf, tried: u64 },
}

/// How many taken `.partial` names a session skips in a row before it gives up.
const MAX_SKIPPED_NAMES: u64 = 64;

/// `--on-segment-closed` run by another process (the privileged broker,
/// so that the command keeps the invoking user's rights).
pub(crate) trait RemoteHooks: Send + Sync {
    /// Runs the command on segment `index` (`file`, `sidecar`: names in the
    /// segments' directory).
    fn submit(&self, index: u64, file: &str, sidecar: &str);
    fn counts(&self) -> HookCounts;
    /// Segments their command deleted or moved away.
    fn deleted(&self) -> Vec<u64>;
    /// Waits up to `grace` for queued commands; the counts and last error.
    fn finish(&self, grace: Duration) -> (HookCounts, Option<String>);
}

/// Where the `--on-segment-closed` command runs.
enum Hooks {
    Local(HookRunner),
    Remote(Arc<dyn RemoteHooks>),
}

impl Hooks {
    fn submit(&self, job: HookJob) {
        match self {
            Hooks::Remote(r) => r.submit(job.index, &job.file, &job.sidecar),
            Hooks::Local(r) => r.submit(job),
        }
    }

    fn counts(&self) -> HookCounts {
        match self {
            Hooks::Local(r) => r.counts(),
            Hooks::Remote(r) => r.counts(),
        }
    }

    /// Segments their command deleted or moved away.
    fn deleted(&self) -> Vec<u64> {
        match self {
            Hooks::Local(r) => r.deleted(),
            Hooks::Remote(r) => r.deleted(),
        }
    }

    fn finish(&mut self, grace: Duration) -> (HookCounts, Option<String>) {
        match self {
            Hooks::Local(r) => {
                let c = r.finish(grace);
                (c, r.last_error())
            }
            Hooks::Remote(r) => r.finish(grace),
        }
    }
}

/// Who and where, for every sidecar of the session.
#[derive(Debug, Clone, Default)]
pub(crate) struct SegmentIdentity {
    pub host: String,
    pub boot_id: String,
    /// The session's UUID as (msb, lsb); segment N's trace UUID is derived from it.
    pub session_uuid: (i64, i64),
    /// `zstd` with its level, or `none`, for the sidecars.
    pub compression: String,
}

/// Segment `index`'s trace UUID: the session's with the index folded into
/// its low half, so segment 0 carries the session's own UUID and every
/// other segment opens in Perfetto as a trace of its own.
pub(crate) fn segment_uuid(session: (i64, i64), index: u64) -> (i64, i64) {
    (session.0, session.1 ^ index as i64)
}

/// One segment, for the summary, `recorder query` and the control plane.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentRecord {
    pub index: u64,
    pub path: PathBuf,
    pub bytes: u64,
    pub(crate) uncompressed_bytes: u64,
    pub packets: u64,
    /// Still on disk (false once the budget deleted it).
    pub kept: bool,
    /// `size`, `period`, `end`, `write_failed`; empty while open.
    pub closed_by: String,
    pub(crate) lost_bytes: u64,
}

/// The segments of the session so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentsStatus {
    pub dir: PathBuf,
    /// Every segment this session made, the open one last.
    pub segments: Vec<SegmentRecord>,
    /// Closed segments the budget deleted.
    pub deleted: u64,
    pub(crate) bytes_on_disk: u64,
    pub hook: Option<HookCounts>,
    /// Errors met while closing or deleting that did not stop the session.
    pub warnings: Vec<String>,
}

impl SegmentsStatus {
    /// Bytes written over all segments, before and after compression.
    pub(crate) fn totals(&self) -> (u64, u64) {
        self.segments
            .iter()
            .fold((0, 0), |(u, c), s| (u + s.uncompressed_bytes, c + s.bytes))
    }
}

/// The segment being written.
struct Open {
    index: u64,
    sink: Box<dyn FileSink>,
    /// The same file, for hashing it again after a failed write.
    file: std::fs::File,
    hasher: Sha256,
    /// The hash no longer matches the file (a failed write cut it back).
    hash_stale: bool,
    opened: Instant,
    first_ts: u64,
    last_ts: u64,
    packets: u64,
    input_bytes: u64,
    loss_at_open: Vec<BufferStats>,
    /// [`SegmentWriter::upstream`]'s counts when the segment opened.
    upstream_at_open: BTreeMap<String, u64>,
}

/// A source's running count of events lost before its buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Upstream {
    events: u64,
    advice: String,
}

/// The output of a session as numbered segments. It is the session's
/// [`FileSink`]: writes go to the segment being written, and
/// [`FileSink::bytes_written`] is that segment's size (what
/// `max_file_size_bytes` and the rotation size apply to).
pub(crate) struct SegmentWriter {
    names: SegmentNames,
    dir: OutputDir,
    policy: RotationPolicy,
    open_opts: OpenOptions,
    identity: SegmentIdentity,
    buffers: Vec<Arc<Buffer>>,
    current: Option<Open>,
    next_index: u64,
    /// Closed segments still on disk, oldest first: (index, bytes with sidecar).
    on_disk: VecDeque<(u64, u64)>,
    status: SegmentsStatus,
    hooks: Option<Hooks>,
    kind: SinkKind,
    /// The latest count of each source's events lost upstream of the
    /// buffers, by source name (see [`SegmentWriter::note_upstream_loss`]).
    upstream: BTreeMap<String, Upstream>,
}

impl SegmentWriter {
    /// Creates the directory if needed, refuses one that already holds
    /// segments of this name, and opens segment 0.
    pub(crate) fn create(
        names: SegmentNames,
        policy: RotationPolicy,
        open_opts: OpenOptions,
        identity: SegmentIdentity,
        buffers: Vec<Arc<Buffer>>,
    ) -> Result<Self, SegmentError> {
        // Walked into and made component by component through checked
        // descriptors: never `create_dir_all` on a path others may write.
        let dir = OutputDir::create(&names.dir)?;
        let entries = dir.entries().map_err(|source| SegmentError::Dir {
            path: names.dir.clone(),
            source,
        })?;
        if let Some(first) = names.existing_among(&entries).into_iter().next() {
            return Err(SegmentError::Exists {
                dir: names.dir.clone(),
                first,
            });
        }
        let hooks = match &policy.on_closed {
            Some(cmd) => Some(Hooks::Local(
                HookRunner::start(
                    cmd.clone(),
                    policy.hook_timeout.unwrap_or(hook::DEFAULT_TIMEOUT),
                    dir.clone(),
                )
                .map_err(SegmentError::Hook)?,
            )),
            None => None,
        };
        let mut w = Self {
            status: SegmentsStatus {
                dir: names.dir.clone(),
                ..Default::default()
            },
            names,
            dir,
            policy,
            open_opts,
            identity,
            buffers,
            current: None,
            next_index: 0,
            on_disk: VecDeque::new(),
            hooks,
            kind: SinkKind::Pwritev,
            upstream: BTreeMap::new(),
        };
        w.open_next()?;
        Ok(w)
    }

    /// The segments' names.
    pub(crate) fn names(&self) -> &SegmentNames {
        &self.names
    }

    /// The directory the segments are made in.
    pub(crate) fn dir(&self) -> &OutputDir {
        &self.dir
    }

    /// The directory, to hand its operations to a broker.
    pub(crate) fn dir_mut(&mut self) -> &mut OutputDir {
        &mut self.dir
    }

    /// Opens the next segment. A `.partial` name another entry already holds
    /// (planted by someone else) is skipped, with a warning: the segment
    /// takes the next index.
    fn open_next(&mut self) -> Result<(), SegmentError> {
        let mut skipped = 0;
        let (index, fd) = loop {
            let index = self.next_index;
            self.next_index += 1;
            match self.dir.create_new(&self.names.partial_name(index)) {
                Ok(fd) => break (index, fd),
                Err(CreateError::Exists { path }) if skipped < MAX_SKIPPED_NAMES => {
                    skipped += 1;
                    let w = format!(
                        "{} was already taken by another entry: segment {index} skipped",
                        path.display()
                    );
                    log::warn!("{w}");
                    self.status.warnings.push(w);
                }
                Err(CreateError::Exists { .. }) => {
                    return Err(SegmentError::NamesTaken {
                        dir: self.names.dir.clone(),
                        tried: skipped + 1,
                    });
                }
                Err(e) => return Err(e.into()),
            }
        };
        let file = std::fs::File::from(fd.try_clone().map_err(|source| SegmentError::Close {
            path: self.names.partial(index),
            source,
        })?);
        let sink = super::output::sink_for(fd, &self.names.partial(index), self.open_opts)?;
        self.kind = sink.kind();
        let now = crate::clock::boottime_ns();
        self.current = Some(Open {
            index,
            sink,
            file,
            hasher: Sha256::new(),
            hash_stale: false,
            opened: Instant::now(),
            first_ts: now,
            last_ts: now,
            packets: 0,
            input_bytes: 0,
            loss_at_open: self.buffers.iter().map(|b| b.stats()).collect(),
            upstream_at_open: self
                .upstream
                .iter()
                .map(|(k, v)| (k.clone(), v.events))
                .collect(),
        });
        self.status.segments.push(SegmentRecord {
            index,
            path: self.names.partial(index),
            kept: true,
            ..Default::default()
        });
        log::debug!("segment {index} opened");
        Ok(())
    }

    /// Records `source`'s count of events lost before its buffer, from its
    /// start (the kernel's overruns, say). Called before each close, so the
    /// closing segment's sidecar holds what grew while it was written.
    pub(crate) fn note_upstream_loss(&mut self, source: &str, events: u64, advice: &str) {
        self.upstream.insert(
            source.to_string(),
            Upstream {
                events,
                advice: advice.to_string(),
            },
        );
    }

    /// The index of the segment being written.
    pub(crate) fn index(&self) -> u64 {
        self.current.as_ref().map_or(self.next_index, |c| c.index)
    }

    /// The trace UUID of the segment being written.
    pub(crate) fn trace_uuid(&self) -> (i64, i64) {
        segment_uuid(self.identity.session_uuid, self.index())
    }

    /// Notes what a pass wrote (packets, bytes before compression).
    pub(crate) fn record_pass(&mut self, rep: &PassReport) {
        if let Some(c) = &mut self.current {
            c.packets += rep.packets;
            c.input_bytes += rep.input_bytes;
            c.last_ts = crate::clock::boottime_ns();
            if let Some(s) = self.status.segments.last_mut() {
                s.bytes = c.sink.bytes_written();
                s.uncompressed_bytes = c.input_bytes;
                s.packets = c.packets;
            }
        }
    }

    /// How full the segment being written is: its bytes and its age.
    pub(crate) fn fill(&self) -> Option<(u64, Duration)> {
        let c = self.current.as_ref()?;
        Some((c.sink.bytes_written(), c.opened.elapsed()))
    }

    /// The rotation decision for the segment being written, now.
    #[cfg(test)]
    pub(crate) fn rotation_due(&self) -> Option<RotateReason> {
        let (bytes, age) = self.fill()?;
        policy::rotation_due(&self.policy, bytes, age)
    }

    /// Closes the segment being written (after appending `tail`, its closing
    /// service packets) and opens the next. The old one is closed even when
    /// opening the next fails.
    pub(crate) fn rotate(
        &mut self,
        tail: &[Vec<u8>],
        reason: RotateReason,
    ) -> Result<(), SegmentError> {
        self.close_current(tail, Sidecar::closed_by_rotation(reason), true)?;
        self.open_next()
    }

    /// Ends the set: the segment being written is closed with `tail`, and
    /// queued commands get [`HOOK_GRACE`] to finish.
    pub(crate) fn finish(&mut self, tail: &[Vec<u8>]) -> Result<(), SegmentError> {
        let r = self.close_current(tail, "end", false);
        self.finish_hooks();
        r
    }

    /// After the output failed: the segment being written keeps what earlier
    /// passes wrote; it is closed as such (rename, sidecar with
    /// `closed_by: write_failed`) as far as the disk allows.
    pub(crate) fn finish_after_failure(&mut self) -> Result<(), SegmentError> {
        let r = self.close_current(&[], "write_failed", false);
        self.finish_hooks();
        r
    }

    /// The files this writer has made that are still there (the segment
    /// being written): handed to a broker that will act on them later.
    pub(crate) fn files_made(&self) -> Vec<String> {
        self.current
            .as_ref()
            .map(|c| vec![self.names.partial_name(c.index)])
            .unwrap_or_default()
    }

    /// The `--on-segment-closed` command and its timeout, if any.
    pub(crate) fn hook_command(&self) -> Option<(&str, Duration)> {
        let timeout = self.policy.hook_timeout.unwrap_or(hook::DEFAULT_TIMEOUT);
        self.policy.on_closed.as_deref().map(|c| (c, timeout))
    }

    /// From now on the command runs in `remote`; the local runner (which
    /// has run nothing yet when this is called at the start) is ended.
    pub(crate) fn hand_hooks_to(&mut self, remote: Arc<dyn RemoteHooks>) {
        if let Some(Hooks::Local(r)) = &mut self.hooks {
            r.finish(Duration::ZERO);
        }
        if self.hooks.is_some() {
            self.hooks = Some(Hooks::Remote(remote));
        }
    }

    fn finish_hooks(&mut self) {
        if let Some(h) = &mut self.hooks {
            let (c, last_error) = h.finish(HOOK_GRACE);
            self.status.hook = Some(c);
            for index in h.deleted() {
                if let Some(s) = self.status.segments.iter_mut().find(|s| s.index == index) {
                    s.kept = false;
                }
            }
            if c.failed > 0
                && let Some(e) = last_error
            {
                self.status.warnings.push(format!(
                    "{} --on-segment-closed command(s) failed; last: {e}",
                    c.failed
                ));
            }
        }
    }

    /// Closes the segment being written; `next` says whether another one
    /// will be opened (the budget then keeps room for it).
    fn close_current(
        &mut self,
        tail: &[Vec<u8>],
        closed_by: &str,
        next: bool,
    ) -> Result<(), SegmentError> {
        let Some(mut c) = self.current.take() else {
            return Ok(());
        };
        let failed = closed_by == "write_failed";
        if !failed && !tail.is_empty() {
            let iov: Vec<IoSlice<'_>> = tail.iter().map(|p| IoSlice::new(p)).collect();
            let wrote = c.sink.write_all(&iov);
            match wrote {
                Ok(_) => {
                    for p in tail {
                        c.hasher.update(p);
                    }
                    c.packets += tail.len() as u64;
                    c.input_bytes += tail.iter().map(|p| p.len() as u64).sum::<u64>();
                }
                Err(e) => {
                    self.current = Some(c);
                    return Err(e.into());
                }
            }
        }
        if !failed && let Err(e) = c.sink.sync_data() {
            self.current = Some(c);
            return Err(e.into());
        }
        let bytes = c.sink.bytes_written();
        // The file written, by identity: what its hook will be handed.
        let file_id =
            crate::storage::create::file_id(&c.file).map_err(|source| SegmentError::Close {
                path: self.names.partial(c.index),
                source,
            })?;
        let partial = self.names.partial(c.index);
        let path = self.names.path(c.index);
        let sha256 = if c.hash_stale || failed {
            drop(c.sink);
            hash_file(&c.file).map_err(|source| SegmentError::Close {
                path: partial.clone(),
                source,
            })?
        } else {
            let digest = c.hasher.clone().finalize();
            drop(c.sink);
            hex(&digest)
        };
        let loss = self.loss_since(&c.loss_at_open, &c.upstream_at_open);
        let lost_bytes = loss.bytes_overwritten + loss.bytes_discarded;
        let uuid = segment_uuid(self.identity.session_uuid, c.index);
        let last_ts = c.last_ts.max(c.first_ts);
        let wall = realtime_offset();
        let car = Sidecar {
            version: SIDECAR_VERSION,
            file: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            index: c.index,
            host: self.identity.host.clone(),
            boot_id: self.identity.boot_id.clone(),
            session_uuid: sidecar::uuid_text(
                self.identity.session_uuid.0,
                self.identity.session_uuid.1,
            ),
            trace_uuid: sidecar::uuid_text(uuid.0, uuid.1),
            first_timestamp_ns: c.first_ts,
            last_timestamp_ns: last_ts,
            first_realtime_ns: to_realtime(c.first_ts, wall),
            last_realtime_ns: to_realtime(last_ts, wall),
            packets: c.packets,
            bytes,
            uncompressed_bytes: c.input_bytes,
            compression: self.identity.compression.clone(),
            loss,
            closed_by: closed_by.to_string(),
            sha256,
        };
        let sidecar_path = self.names.sidecar(c.index);
        let sidecar_name = self.names.sidecar_name(c.index);
        if let Some(s) = self.status.segments.last_mut() {
            s.path = path.clone();
            s.bytes = bytes;
            s.uncompressed_bytes = c.input_bytes;
            s.packets = c.packets;
            s.closed_by = closed_by.to_string();
            s.lost_bytes = lost_bytes;
        }
        // The sidecar first, then the rename: a segment under its final name
        // always has its sidecar, even after a crash between the two (which
        // leaves the sidecar beside a whole `.partial`). A segment whose
        // sidecar cannot be written (a full disk) stays `.partial`: still a
        // valid trace up to its last whole packet, but not one the set
        // vouches for.
        let (sidecar_bytes, sidecar_id) = match car.write_atomically(&self.dir, &sidecar_name) {
            Ok(n) => n,
            Err(source) => {
                if let Some(s) = self.status.segments.last_mut() {
                    s.path = partial.clone();
                }
                self.on_disk.push_back((c.index, bytes));
                log::warn!(
                    "segment {} left as {}: its sidecar could not be written: {source}",
                    c.index,
                    partial.display()
                );
                let _ = self.dir.sync();
                return Err(SegmentError::Close {
                    path: sidecar_path,
                    source,
                });
            }
        };
        self.dir
            .rename(
                &self.names.partial_name(c.index),
                &self.names.file_name(c.index),
            )
            .map_err(|e| SegmentError::Close {
                path: partial.clone(),
                source: std::io::Error::other(e),
            })?;
        // The rename and the sidecar are durable once the directory is.
        let dir_synced = self.dir.sync();
        self.on_disk.push_back((c.index, bytes + sidecar_bytes));
        log::info!(
            "segment {} closed ({closed_by}): {} bytes, {} packets",
            c.index,
            bytes,
            c.packets
        );
        if let Err(source) = dir_synced {
            return Err(SegmentError::Close {
                path: self.names.dir.clone(),
                source,
            });
        }
        self.forget_hook_deletions();
        self.enforce_budget(next);
        if let Some(h) = &self.hooks {
            h.submit(HookJob {
                file: self.names.file_name(c.index),
                file_id,
                sidecar: sidecar_name,
                sidecar_id,
                index: c.index,
            });
        }
        Ok(())
    }

    /// Segments their command deleted or moved are no longer on disk: not
    /// kept, and no longer counted against the budget.
    fn forget_hook_deletions(&mut self) {
        let Some(h) = &self.hooks else { return };
        for index in h.deleted() {
            self.on_disk.retain(|(i, _)| *i != index);
            if let Some(s) = self.status.segments.iter_mut().find(|s| s.index == index) {
                s.kept = false;
            }
        }
    }

    /// Deletes the oldest closed segments until the set fits the budget. The
    /// segment being written is never deleted; when another follows
    /// (`next`), room is kept for it (a whole `--rotate-size`).
    fn enforce_budget(&mut self, next: bool) {
        let (open, reserve) = if next {
            (1, self.policy.size.unwrap_or(0))
        } else {
            (0, 0)
        };
        loop {
            let closed = self.on_disk.len() as u64;
            let used: u64 = self.on_disk.iter().map(|(_, b)| b).sum();
            let over_count = self
                .policy
                .max_segments
                .is_some_and(|n| closed + open > u64::from(n));
            let over_disk = self.policy.max_disk.is_some_and(|d| used + reserve > d);
            if !(over_count || over_disk) {
                break;
            }
            let Some((index, _)) = self.on_disk.pop_front() else {
                break;
            };
            for name in [self.names.file_name(index), self.names.sidecar_name(index)] {
                if let Err(e) = self.dir.remove(&name) {
                    self.status.warnings.push(format!("cannot delete: {e}"));
                }
            }
            self.status.deleted += 1;
            if let Some(s) = self.status.segments.iter_mut().find(|s| s.index == index) {
                s.kept = false;
            }
            log::info!("segment {index} deleted (disk budget)");
        }
    }

    fn loss_since(&self, at_open: &[BufferStats], upstream: &BTreeMap<String, u64>) -> SegmentLoss {
        let mut l = SegmentLoss::default();
        for (b, then) in self.buffers.iter().zip(at_open) {
            let now = b.stats();
            l.bytes_overwritten += now.bytes_overwritten.saturating_sub(then.bytes_overwritten);
            l.packets_overwritten += now
                .packets_overwritten
                .saturating_sub(then.packets_overwritten);
            l.bytes_discarded += now.bytes_discarded.saturating_sub(then.bytes_discarded);
            l.packets_discarded += now.packets_discarded.saturating_sub(then.packets_discarded);
            l.packets_refused += now.packets_refused.saturating_sub(then.packets_refused);
        }
        if l.bytes_overwritten > 0 {
            l.why.push(
                "RING_BUFFER overwrote chunks before a write pass read them: raise size_kb or shorten file_write_period_ms".into(),
            );
        }
        if l.bytes_discarded > 0 || l.packets_discarded > 0 {
            l.why.push(
                "DISCARD refused packets while the buffer was full: raise size_kb or shorten file_write_period_ms".into(),
            );
        }
        if l.packets_refused > 0 {
            l.why
                .push("packets larger than their buffer were refused".into());
        }
        for (source, u) in &self.upstream {
            let lost = u
                .events
                .saturating_sub(upstream.get(source).copied().unwrap_or(0));
            if lost > 0 {
                l.events_lost_upstream += lost;
                l.why.push(format!(
                    "{source}: {lost} events were lost before they reached the buffer: {}",
                    u.advice
                ));
            }
        }
        l
    }

    /// The segments so far, for the summary and `recorder query`.
    pub(crate) fn status(&self) -> SegmentsStatus {
        let mut s = self.status.clone();
        if let (Some(c), Some(last)) = (&self.current, s.segments.last_mut()) {
            last.bytes = c.sink.bytes_written();
        }
        s.bytes_on_disk = self.on_disk.iter().map(|(_, b)| b).sum::<u64>()
            + self.current.as_ref().map_or(0, |c| c.sink.bytes_written());
        if let Some(h) = &self.hooks
            && s.hook.is_none()
        {
            s.hook = Some(h.counts());
            for index in h.deleted() {
                if let Some(r) = s.segments.iter_mut().find(|r| r.index == index) {
                    r.kept = false;
                }
            }
        }
        s
    }

    /// Bytes written over every segment.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.status().totals().1
    }
}

impl FileSink for SegmentWriter {
    fn kind(&self) -> SinkKind {
        self.current.as_ref().map_or(self.kind, |c| c.sink.kind())
    }

    fn write_list(&mut self, list: &mut WriteList<'_, '_>) -> Result<u64, SinkError> {
        let Some(c) = &mut self.current else {
            return Ok(0);
        };
        // Hashed before the write: once written, the caller may let go of
        // the bytes (P1). A failed write makes the hash stale.
        for b in list.rest() {
            c.hasher.update(b);
        }
        let r = c.sink.write_list(list);
        if r.is_err() {
            c.hash_stale = true;
        }
        r
    }

    fn sync_data(&mut self) -> Result<(), SinkError> {
        match &mut self.current {
            Some(c) => c.sink.sync_data(),
            None => Ok(()),
        }
    }

    fn bytes_written(&self) -> u64 {
        self.current.as_ref().map_or(0, |c| c.sink.bytes_written())
    }
}

/// The trace output: one file (or stdout), or numbered segments.
pub(crate) enum Output {
    File(Box<dyn FileSink>),
    Segments(Box<SegmentWriter>),
}

impl Output {
    /// The sink write passes go to.
    pub(crate) fn as_sink(&mut self) -> &mut dyn FileSink {
        match self {
            Output::File(s) => s.as_mut(),
            Output::Segments(w) => w.as_mut(),
        }
    }

    /// The sink, to look at.
    pub(crate) fn as_ref_sink(&self) -> &dyn FileSink {
        match self {
            Output::File(s) => s.as_ref(),
            Output::Segments(w) => w.as_ref(),
        }
    }

    /// Bytes written over the whole session.
    pub(crate) fn bytes_written(&self) -> u64 {
        match self {
            Output::File(s) => s.bytes_written(),
            Output::Segments(w) => w.total_bytes(),
        }
    }

    pub(crate) fn kind(&self) -> SinkKind {
        match self {
            Output::File(s) => s.kind(),
            Output::Segments(w) => w.kind(),
        }
    }

    pub(crate) fn sync_data(&mut self) -> Result<(), SinkError> {
        self.as_sink().sync_data()
    }

    pub(crate) fn segments(&self) -> Option<SegmentsStatus> {
        match self {
            Output::File(_) => None,
            Output::Segments(w) => Some(w.status()),
        }
    }
}

/// REALTIME minus BOOTTIME now, in ns.
fn realtime_offset() -> i128 {
    let boot = crate::clock::boottime_ns();
    i128::from(crate::clock::BuiltinClock::Realtime.now_ns()) - i128::from(boot)
}

/// A BOOTTIME instant on the wall clock, given their difference (None
/// before the epoch: a clock not yet set).
fn to_realtime(boottime_ns: u64, offset: i128) -> Option<u64> {
    u64::try_from(i128::from(boottime_ns) + offset).ok()
}

/// The sha256 of the whole file, read through the descriptor kept open
/// (after a privilege drop the path may no longer be ours to open).
fn hash_file(f: &std::fs::File) -> std::io::Result<String> {
    use std::os::unix::fs::FileExt;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut at = 0u64;
    loop {
        let n = f.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
pub(crate) mod tests;

//! The producer side of a session: its handle on the
//! [`registry`](super::registry) of producers, which matches the config's
//! data sources to what the producers registered (by name and the producer
//! filters, ARCHITECTURE.md §8.2).
//!
//! The event loop polls [`ProducerHost::fds`], calls [`ProducerHost::poll`]
//! and turns the returned [`HostEvent`]s into session events; it carries out
//! the session's start, flush and stop here too. Producers that connect
//! after the start are started as soon as they can take commands.
//!
//! A session of `recorder --config` owns its registry and polls the socket
//! itself. Under `recorder serve` one [`ProducerService`] lives as long as
//! the service, polled by the service's one loop with everything else; each
//! session attaches to it and takes its events when the loop wakes.

use std::os::fd::BorrowedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::filter::ProducerFilter;
use super::quota::{self, MAX_CONNECTIONS_PER_UID, UidReport};
use super::registry::{AttachError, ProducerRegistry};
use super::stats::{ProducerStats, ProducerTotals};
use crate::ringbuf::Buffer;
use crate::transport::socket_path::{self, SocketPathError};

/// The scheduler slice the thread that serves producers asks for
/// ([`crate::sys::sched`]): the shortest the kernel gives. A 256 KiB shared
/// memory holds about a millisecond of a fast app's packets, and the app
/// drops what it writes while the chunks wait for this thread to wake.
const SERVING_SLICE: Duration = Duration::from_micros(100);

/// A config data source that producers may provide.
#[derive(Clone, Debug)]
pub(crate) struct WantedSource {
    pub name: String,
    pub filter: ProducerFilter,
    /// Buffer id: the session's buffer base + index + 1
    /// ([`ProducerHost::buffer_base`]).
    pub buffer: u32,
    /// The DataSourceConfig as written, service fields rewritten.
    pub config: Vec<u8>,
}

/// Whose per-uid quota figures a session's trace and summary show. Under
/// `recorder serve` the quota accounts are the service's, shared by every
/// session: an unprivileged consumer's session shows its own uid's only
/// (another local user's hits are not its business), root's and the main
/// job's (`recorder --config`, one session) show every uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QuotaView {
    All,
    Uid(u32),
}

impl QuotaView {
    /// The view of a session run for `consumer` (a served session's
    /// client uid), or of the main job when there is none.
    pub(crate) fn for_consumer(consumer: Option<u32>) -> Self {
        match consumer {
            Some(uid) if uid != 0 => Self::Uid(uid),
            _ => Self::All,
        }
    }

    /// The reports this view shows. The shared account of the uids past
    /// the table mixes other users, so a single-uid view leaves it out.
    pub(crate) fn filter(self, mut reports: Vec<UidReport>) -> Vec<UidReport> {
        if let Self::Uid(uid) = self {
            reports.retain(|r| r.uid == uid);
        }
        reports
    }
}

/// What the loop turns into session events.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum HostEvent {
    Triggers {
        producer: String,
        uid: u32,
        names: Vec<String>,
    },
    /// Every producer asked in flush `id` acknowledged it (or went away).
    Flushed(u64),
    /// Every instance started at the start that acknowledges starts has
    /// (or went away).
    Started,
    /// Every instance that acknowledges stops has (or went away).
    Stopped,
}

/// What one producer did, for the summary and `trace_stats`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProducerReport {
    pub name: String,
    pub pid: u32,
    pub uid: u32,
    pub data_sources: Vec<String>,
    pub stats: ProducerStats,
    pub connected: bool,
}

/// Errors of the producer side.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostError {
    #[error(transparent)]
    Socket(#[from] SocketPathError),
    #[error("producer service")]
    Attach(#[from] AttachError),
}

/// A session's producers.
pub(crate) struct ProducerHost {
    link: Link,
    /// The serving thread asked for [`SERVING_SLICE`] (on its first poll).
    slice_asked: bool,
    /// The session's key in the registry.
    key: u64,
    base: u32,
    path: PathBuf,
}

enum Link {
    /// The session's own socket, polled by its loop.
    Own(Box<ProducerRegistry>),
    /// Attached to `recorder serve`'s service, which the service's loop
    /// polls.
    Served(Arc<Mutex<ProducerRegistry>>),
}

impl ProducerHost {
    /// Listens on `path` (see [`socket_path::claim`]) for a session of
    /// `buffers` buffers, whose ids are index + 1.
    pub(crate) fn listen(path: &Path, buffers: usize) -> Result<Self, HostError> {
        let listener = socket_path::claim(path)?;
        let max = quota::connection_budget(quota::open_file_limit());
        log::info!(
            "producer socket: {} (at most {max} connections, {MAX_CONNECTIONS_PER_UID} per uid)",
            path.display()
        );
        let mut registry = ProducerRegistry::new(listener, path, true);
        let (key, base) = registry.attach(buffers)?;
        Ok(Self {
            link: Link::Own(Box::new(registry)),
            slice_asked: false,
            key,
            base,
            path: path.to_path_buf(),
        })
    }

    /// Attaches a session of `buffers` buffers to `service`; its buffer ids
    /// start after [`Self::buffer_base`].
    pub(crate) fn attach(service: &ProducerService, buffers: usize) -> Result<Self, HostError> {
        let (key, base) = lock(&service.registry).attach(buffers)?;
        Ok(Self {
            link: Link::Served(service.registry.clone()),
            // The service's loop serves the producers.
            slice_asked: true,
            key,
            base,
            path: service.path.clone(),
        })
    }

    /// What the session wants of producers, the rings its buffer ids name
    /// (in order) and the first sequence id its producers' writers get.
    pub(crate) fn serve(
        &mut self,
        wanted: Vec<WantedSource>,
        buffers: Vec<Arc<Buffer>>,
        first_sequence: u32,
    ) {
        let key = self.key;
        self.with(|r| r.serve(key, wanted, buffers, first_sequence));
    }

    /// Buffer `i` of the session has id `buffer_base() + i + 1`.
    pub(crate) fn buffer_base(&self) -> u32 {
        self.base
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the registry.
    fn with<R>(&mut self, f: impl FnOnce(&mut ProducerRegistry) -> R) -> R {
        match &mut self.link {
            Link::Own(r) => f(r),
            Link::Served(registry) => f(&mut lock(registry)),
        }
    }

    fn read<R>(&self, f: impl FnOnce(&ProducerRegistry) -> R) -> R {
        match &self.link {
            Link::Own(r) => f(r),
            Link::Served(registry) => f(&lock(registry)),
        }
    }

    /// Descriptors to wait on: the session's own socket and producers; none
    /// under `recorder serve`, whose loop waits on the service's.
    pub(crate) fn fds(&self) -> Vec<BorrowedFd<'_>> {
        match &self.link {
            Link::Own(r) => r.fds(),
            Link::Served(_) => Vec::new(),
        }
    }

    /// Accepts, reads and handles what the producers sent (under `recorder
    /// serve` the service's loop did that) and returns the session's events.
    pub(crate) fn poll(&mut self) -> Vec<HostEvent> {
        let key = self.key;
        if !std::mem::replace(&mut self.slice_asked, true) {
            ask_for_serving_slice();
        }
        match &mut self.link {
            Link::Own(r) => {
                r.poll();
                r.take_events(key)
            }
            Link::Served(registry) => lock(registry).take_events(key),
        }
    }

    /// The session started: start every instance set up so far, and
    /// whatever connects later. Whether start acks are due from instances
    /// that promised them (`will_notify_on_start`; [`HostEvent::Started`]
    /// follows once they all came or their producers went).
    pub(crate) fn start(&mut self) -> bool {
        let key = self.key;
        self.with(|r| r.start(key))
    }

    /// The (producer, data source) pairs whose start ack is still awaited,
    /// at most `max`.
    pub(crate) fn not_started(&self, max: usize) -> Vec<(String, String)> {
        self.read(|r| r.not_started(self.key, max))
    }

    /// Flush `id` (at the stop when `stop`): sends Flush to every producer
    /// with instances of the session that flush. Whether acks are due
    /// ([`HostEvent::Flushed`] follows).
    pub(crate) fn flush(&mut self, id: u64, stop: bool) -> bool {
        let key = self.key;
        self.with(|r| r.flush(key, id, stop))
    }

    /// Stops the session's instances. Whether stop acks are due
    /// ([`HostEvent::Stopped`] follows).
    pub(crate) fn stop(&mut self) -> bool {
        let key = self.key;
        self.with(|r| r.stop(key))
    }

    /// Reads what every producer that allows it wrote for the session and
    /// has not committed yet (at the end of a flush and at the stop).
    pub(crate) fn scrape(&mut self) {
        let key = self.key;
        self.with(|r| r.scrape(key));
    }

    /// ClearIncrementalState to the session's instances.
    pub(crate) fn clear_incremental_state(&mut self) {
        let key = self.key;
        self.with(|r| r.clear_incremental_state(key));
    }

    /// The figures of every producer in all, for `trace_stats`.
    pub(crate) fn totals(&self) -> ProducerTotals {
        self.read(|r| r.totals(self.key))
    }

    /// Every uid that hit a limit or whose closed producers were folded,
    /// by uid.
    pub(crate) fn quota_reports(&self) -> Vec<UidReport> {
        self.read(ProducerRegistry::quota_reports)
    }

    /// Every producer seen so far, connected ones last.
    pub(crate) fn reports(&self) -> Vec<ProducerReport> {
        self.read(|r| r.reports(self.key))
    }
}

impl Drop for ProducerHost {
    fn drop(&mut self) {
        let key = self.key;
        match &mut self.link {
            Link::Own(r) => {
                r.finish();
                let _ = std::fs::remove_file(&self.path);
            }
            // Its instances end; the producers stay for other sessions.
            Link::Served(registry) => lock(registry).detach(key),
        }
    }
}

/// The producer socket of `recorder serve`: one registry for every
/// session, polled by the service's loop for as long as it runs.
pub(crate) struct ProducerService {
    registry: Arc<Mutex<ProducerRegistry>>,
    path: PathBuf,
}

impl ProducerService {
    /// Serves producers on `listener`, bound at `path`.
    pub(crate) fn new(listener: UnixListener, path: &Path) -> Self {
        Self {
            registry: Arc::new(Mutex::new(ProducerRegistry::new(listener, path, false))),
            path: path.to_path_buf(),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The socket and every producer's, to wait on (shared handles: one
    /// closed meanwhile stays open until they are dropped).
    pub(crate) fn handles(&self) -> (Arc<UnixListener>, Vec<Arc<UnixStream>>) {
        lock(&self.registry).handles()
    }

    /// Accepts, reads and handles what producers sent; each session takes
    /// its events ([`ProducerHost::poll`]).
    pub(crate) fn poll(&self) {
        lock(&self.registry).poll();
    }

    /// Every connected producer with the data sources it registered.
    pub(crate) fn producers(&self) -> Vec<ProducerReport> {
        lock(&self.registry).listing()
    }
}

/// The calling thread serves producers from now on: it asks for
/// `SERVING_SLICE`, and goes on with the default where the kernel says no.
pub(crate) fn ask_for_serving_slice() {
    if let Err(e) = crate::sys::sched::request_slice(SERVING_SLICE) {
        log::debug!("producer service: default scheduler slice kept: {e}");
    }
}

/// The registry, whatever a panicking holder left: every update is a
/// single step under the lock.
fn lock(m: &Mutex<ProducerRegistry>) -> MutexGuard<'_, ProducerRegistry> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(uid: u32) -> UidReport {
        UidReport {
            uid,
            ..UidReport::default()
        }
    }

    #[test]
    fn a_served_session_of_an_unprivileged_uid_sees_only_its_own_quota_figures() {
        let all = || vec![report(1000), report(65_534), report(quota::OTHER_UIDS)];
        let own = QuotaView::for_consumer(Some(1000)).filter(all());
        assert_eq!(own, vec![report(1000)]);
        assert!(QuotaView::for_consumer(Some(4242)).filter(all()).is_empty());
        // Root's served sessions and the main job see every uid.
        assert_eq!(QuotaView::for_consumer(Some(0)).filter(all()), all());
        assert_eq!(QuotaView::for_consumer(None).filter(all()), all());
    }
}

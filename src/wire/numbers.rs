//! Field numbers of the messages the recorder writes and reads, one module
//! per message (Perfetto's `protos/perfetto/config/` for configs,
//! `protos/perfetto/trace/` and `protos/perfetto/common/` for the trace;
//! ARCHITECTURE.md §7). Enum values live with the code that chooses
//! them; only field numbers are here.

/// `Trace`: the file.
pub(crate) mod trace {
    pub(crate) const PACKET: u32 = 1;
}

/// `TracePacket` (ARCHITECTURE.md §7.2).
pub mod trace_packet {
    /// Reserved by Perfetto (a retired field that will not be reused): the
    /// recorder's padding packets put their filler bytes here.
    pub(crate) const PADDING: u32 = 55;
    // Fields outside the `data` oneof.
    /// `TracePacket.trusted_uid`, field 3: the uid of the producer that
    /// wrote the packet, stamped by the service, never by the producer.
    pub const TRUSTED_UID: u32 = 3;
    pub(crate) const TIMESTAMP: u32 = 8;
    /// `TracePacket.trusted_packet_sequence_id`, field 10: the writer
    /// sequence the packet belongs to, stamped by the service; readers
    /// order and de-intern per sequence.
    pub const TRUSTED_PACKET_SEQUENCE_ID: u32 = 10;
    pub(crate) const INTERNED_DATA: u32 = 12;
    pub(crate) const SEQUENCE_FLAGS: u32 = 13;
    pub(crate) const INCREMENTAL_STATE_CLEARED: u32 = 41;
    /// `TracePacket.previous_packet_dropped`, field 42: set on the first
    /// packet after packets of the same sequence were lost.
    pub const PREVIOUS_PACKET_DROPPED: u32 = 42;
    pub(crate) const TIMESTAMP_CLOCK_ID: u32 = 58;
    pub(crate) const TRACE_PACKET_DEFAULTS: u32 = 59;
    /// `TracePacket.trusted_pid`, field 79: the pid of the producer that
    /// wrote the packet, stamped by the service.
    pub const TRUSTED_PID: u32 = 79;
    pub(crate) const FIRST_PACKET_ON_SEQUENCE: u32 = 87;
    /// `TracePacket.machine_id`, field 98: which machine of a
    /// multi-machine trace the packet came from; service-only.
    pub const MACHINE_ID: u32 = 98;

    /// Fields only the service may write (ARCHITECTURE.md §7.3): a producer packet
    /// that sets one is dropped and counted.
    pub(crate) const SERVICE_ONLY: &[u32] = &[
        TRUSTED_UID,
        TRUSTED_PACKET_SEQUENCE_ID,
        TRACE_CONFIG,
        TRACE_STATS,
        SYNCHRONIZATION_MARKER,
        COMPRESSED_PACKETS,
        SERVICE_EVENT,
        TRUSTED_PID,
        MACHINE_ID,
        TRACE_PROVENANCE,
        PROTOVMS,
        ZSTD_COMPRESSED_PACKETS,
    ];

    /// Every field outside the `data` oneof.
    pub(crate) const NON_DATA: &[u32] = &[
        TRUSTED_UID,
        TIMESTAMP,
        TRUSTED_PACKET_SEQUENCE_ID,
        INTERNED_DATA,
        SEQUENCE_FLAGS,
        INCREMENTAL_STATE_CLEARED,
        PREVIOUS_PACKET_DROPPED,
        TIMESTAMP_CLOCK_ID,
        TRACE_PACKET_DEFAULTS,
        TRUSTED_PID,
        FIRST_PACKET_ON_SEQUENCE,
        MACHINE_ID,
    ];

    // Members of the `data` oneof.
    pub(crate) const FTRACE_EVENTS: u32 = 1;
    pub(crate) const PROCESS_TREE: u32 = 2;
    pub(crate) const INODE_FILE_MAP: u32 = 4;
    pub(crate) const CHROME_EVENTS: u32 = 5;
    pub(crate) const CLOCK_SNAPSHOT: u32 = 6;
    pub(crate) const SYS_STATS: u32 = 7;
    pub(crate) const PROCESS_STATS: u32 = 9;
    pub(crate) const TRACK_EVENT: u32 = 11;
    pub(crate) const TRACE_CONFIG: u32 = 33;
    pub(crate) const FTRACE_STATS: u32 = 34;
    pub(crate) const TRACE_STATS: u32 = 35;
    pub(crate) const SYNCHRONIZATION_MARKER: u32 = 36;
    pub(crate) const PROFILE_PACKET: u32 = 37;
    pub(crate) const PROCESS_DESCRIPTOR: u32 = 43;
    pub(crate) const THREAD_DESCRIPTOR: u32 = 44;
    pub(crate) const SYSTEM_INFO: u32 = 45;
    pub(crate) const TRIGGER: u32 = 46;
    pub(crate) const PACKAGES_LIST: u32 = 47;
    pub(crate) const PERFETTO_METATRACE: u32 = 49;
    pub(crate) const COMPRESSED_PACKETS: u32 = 50;
    pub(crate) const TRACK_DESCRIPTOR: u32 = 60;
    pub(crate) const SERVICE_EVENT: u32 = 69;
    pub(crate) const EXTENSION_DESCRIPTOR: u32 = 72;
    pub(crate) const TRACE_UUID: u32 = 89;
    pub(crate) const REMOTE_CLOCK_SYNC: u32 = 107;
    pub(crate) const CLONE_SNAPSHOT_TRIGGER: u32 = 113;
    pub(crate) const TRACE_PROVENANCE: u32 = 124;
    pub(crate) const PROTOVMS: u32 = 125;
    pub(crate) const TRACE_ATTRIBUTES: u32 = 126;
    pub(crate) const ZSTD_COMPRESSED_PACKETS: u32 = 133;
    pub(crate) const CONCURRENT_SESSION_EVENT: u32 = 134;
    /// `TracePacket.for_testing`, field 900: a `TestEvent`, the payload of
    /// the `for_testing` data source.
    pub const FOR_TESTING: u32 = 900;

    /// The `data` members by name (for `inspect`).
    pub(crate) const DATA_NAMES: &[(u32, &str)] = &[
        (FTRACE_EVENTS, "ftrace_events"),
        (PROCESS_TREE, "process_tree"),
        (INODE_FILE_MAP, "inode_file_map"),
        (CHROME_EVENTS, "chrome_events"),
        (CLOCK_SNAPSHOT, "clock_snapshot"),
        (SYS_STATS, "sys_stats"),
        (PROCESS_STATS, "process_stats"),
        (TRACK_EVENT, "track_event"),
        (TRACE_CONFIG, "trace_config"),
        (FTRACE_STATS, "ftrace_stats"),
        (TRACE_STATS, "trace_stats"),
        (SYNCHRONIZATION_MARKER, "synchronization_marker"),
        (PROFILE_PACKET, "profile_packet"),
        (PROCESS_DESCRIPTOR, "process_descriptor"),
        (THREAD_DESCRIPTOR, "thread_descriptor"),
        (SYSTEM_INFO, "system_info"),
        (TRIGGER, "trigger"),
        (PACKAGES_LIST, "packages_list"),
        (PERFETTO_METATRACE, "perfetto_metatrace"),
        (COMPRESSED_PACKETS, "compressed_packets"),
        (TRACK_DESCRIPTOR, "track_descriptor"),
        (SERVICE_EVENT, "service_event"),
        (EXTENSION_DESCRIPTOR, "extension_descriptor"),
        (TRACE_UUID, "trace_uuid"),
        (REMOTE_CLOCK_SYNC, "remote_clock_sync"),
        (CLONE_SNAPSHOT_TRIGGER, "clone_snapshot_trigger"),
        (TRACE_PROVENANCE, "trace_provenance"),
        (PROTOVMS, "protovms"),
        (TRACE_ATTRIBUTES, "trace_attributes"),
        (ZSTD_COMPRESSED_PACKETS, "zstd_compressed_packets"),
        (CONCURRENT_SESSION_EVENT, "concurrent_session_event"),
        (FOR_TESTING, "for_testing"),
    ];
}

/// `ClockSnapshot` (ARCHITECTURE.md §7.7).
pub(crate) mod clock_snapshot {
    pub(crate) const CLOCKS: u32 = 1;
    pub(crate) const PRIMARY_TRACE_CLOCK: u32 = 2;
}

/// `ClockSnapshot.Clock`.
pub(crate) mod clock {
    pub(crate) const CLOCK_ID: u32 = 1;
    pub(crate) const TIMESTAMP: u32 = 2;
}

/// `TraceUuid` (ARCHITECTURE.md §7.8).
pub(crate) mod trace_uuid {
    pub(crate) const MSB: u32 = 1;
    pub(crate) const LSB: u32 = 2;
}

/// `TraceAttributes`.
pub(crate) mod trace_attributes {
    pub(crate) const ATTRIBUTE: u32 = 1;
}

/// `TraceAttributes.Attribute`.
pub(crate) mod attribute {
    pub(crate) const KEY: u32 = 1;
    pub(crate) const LONG_VALUE: u32 = 2;
    pub(crate) const STRING_VALUE: u32 = 3;
}

/// `SystemInfo` (ARCHITECTURE.md §7.8).
pub(crate) mod system_info {
    pub(crate) const UTSNAME: u32 = 1;
    pub(crate) const TRACING_SERVICE_VERSION: u32 = 4;
    pub(crate) const PAGE_SIZE: u32 = 6;
    pub(crate) const TIMEZONE_OFF_MINS: u32 = 7;
    pub(crate) const NUM_CPUS: u32 = 8;
    pub(crate) const SYSTEM_RAM_BYTES: u32 = 16;
}

/// `Utsname`.
pub(crate) mod utsname {
    pub(crate) const SYSNAME: u32 = 1;
    pub(crate) const VERSION: u32 = 2;
    pub(crate) const RELEASE: u32 = 3;
    pub(crate) const MACHINE: u32 = 4;
}

/// `TracingServiceEvent` (ARCHITECTURE.md §7.8): a oneof, one field per event.
pub mod tracing_service_event {
    pub(crate) const ALL_DATA_SOURCES_STARTED: u32 = 1;
    pub(crate) const TRACING_STARTED: u32 = 2;
    pub(crate) const ALL_DATA_SOURCES_FLUSHED: u32 = 3;
    pub(crate) const READ_TRACING_BUFFERS_COMPLETED: u32 = 4;
    pub(crate) const TRACING_DISABLED: u32 = 5;
    pub(crate) const SEIZED_FOR_BUGREPORT: u32 = 6;
    pub(crate) const SLOW_STARTING_DATA_SOURCES: u32 = 7;
    pub(crate) const LAST_FLUSH_SLOW_DATA_SOURCES: u32 = 8;
    pub(crate) const FLUSH_STARTED: u32 = 9;
    pub(crate) const CLONE_STARTED: u32 = 10;
    pub(crate) const BUFFER_CLONED: u32 = 11;
    /// The recorder's own event, far above Perfetto's numbers so readers
    /// that do not know it skip it: the recording process died and another
    /// process wrote what its buffers held (`trace::salvage`).
    pub const RECORDER_DIED: u32 = 1001;

    /// The recorder's own events by name.
    pub(crate) const RECORDER_NAMES: &[(u32, &str)] = &[(RECORDER_DIED, "recorder_died")];

    /// The events by name (for `inspect`).
    pub(crate) const NAMES: &[(u32, &str)] = &[
        (ALL_DATA_SOURCES_STARTED, "all_data_sources_started"),
        (TRACING_STARTED, "tracing_started"),
        (ALL_DATA_SOURCES_FLUSHED, "all_data_sources_flushed"),
        (
            READ_TRACING_BUFFERS_COMPLETED,
            "read_tracing_buffers_completed",
        ),
        (TRACING_DISABLED, "tracing_disabled"),
        (SEIZED_FOR_BUGREPORT, "seized_for_bugreport"),
        (SLOW_STARTING_DATA_SOURCES, "slow_starting_data_sources"),
        (LAST_FLUSH_SLOW_DATA_SOURCES, "last_flush_slow_data_sources"),
        (FLUSH_STARTED, "flush_started"),
        (CLONE_STARTED, "clone_started"),
        (BUFFER_CLONED, "buffer_cloned"),
    ];
}

/// `TracingServiceEvent.DataSources` (slow_starting_data_sources,
/// last_flush_slow_data_sources; ARCHITECTURE.md §7.8): repeated `data_source`, each
/// {producer_name, data_source_name}.
pub(crate) mod service_event_data_sources {
    pub(crate) const DATA_SOURCE: u32 = 1;
    pub(crate) const PRODUCER_NAME: u32 = 1;
    pub(crate) const DATA_SOURCE_NAME: u32 = 2;
}

/// `Trigger` (ARCHITECTURE.md §7.8).
pub(crate) mod trigger {
    pub(crate) const TRIGGER_NAME: u32 = 1;
    pub(crate) const PRODUCER_NAME: u32 = 2;
    pub(crate) const TRUSTED_PRODUCER_UID: u32 = 3;
    pub(crate) const STOP_DELAY_MS: u32 = 4;
}

/// `TraceStats` (ARCHITECTURE.md §7.6).
pub(crate) mod trace_stats {
    pub(crate) const BUFFER_STATS: u32 = 1;
    pub(crate) const PRODUCERS_CONNECTED: u32 = 2;
    pub(crate) const PRODUCERS_SEEN: u32 = 3;
    pub(crate) const DATA_SOURCES_REGISTERED: u32 = 4;
    pub(crate) const DATA_SOURCES_SEEN: u32 = 5;
    pub(crate) const TRACING_SESSIONS: u32 = 6;
    pub(crate) const TOTAL_BUFFERS: u32 = 7;
    pub(crate) const CHUNKS_DISCARDED: u32 = 8;
    pub(crate) const PATCHES_DISCARDED: u32 = 9;
    pub(crate) const INVALID_PACKETS: u32 = 10;
    pub(crate) const FLUSHES_REQUESTED: u32 = 12;
    pub(crate) const FLUSHES_SUCCEEDED: u32 = 13;
    pub(crate) const FLUSHES_FAILED: u32 = 14;
    pub(crate) const FINAL_FLUSH_OUTCOME: u32 = 15;
    pub(crate) const WRITER_STATS: u32 = 18;

    /// The scalar fields by name (for `inspect`).
    pub(crate) const SCALAR_NAMES: &[(u32, &str)] = &[
        (PRODUCERS_CONNECTED, "producers_connected"),
        (PRODUCERS_SEEN, "producers_seen"),
        (DATA_SOURCES_REGISTERED, "data_sources_registered"),
        (DATA_SOURCES_SEEN, "data_sources_seen"),
        (TRACING_SESSIONS, "tracing_sessions"),
        (TOTAL_BUFFERS, "total_buffers"),
        (CHUNKS_DISCARDED, "chunks_discarded"),
        (PATCHES_DISCARDED, "patches_discarded"),
        (INVALID_PACKETS, "invalid_packets"),
        (FLUSHES_REQUESTED, "flushes_requested"),
        (FLUSHES_SUCCEEDED, "flushes_succeeded"),
        (FLUSHES_FAILED, "flushes_failed"),
        (FINAL_FLUSH_OUTCOME, "final_flush_outcome"),
    ];
}

/// `TraceStats.BufferStats` (ARCHITECTURE.md §7.6): all uint64, numbered 1–20.
pub(crate) mod buffer_stats {
    pub(crate) const BYTES_WRITTEN: u32 = 1;
    pub(crate) const CHUNKS_WRITTEN: u32 = 2;
    pub(crate) const CHUNKS_OVERWRITTEN: u32 = 3;
    pub(crate) const WRITE_WRAP_COUNT: u32 = 4;
    pub(crate) const PATCHES_SUCCEEDED: u32 = 5;
    pub(crate) const PATCHES_FAILED: u32 = 6;
    pub(crate) const ABI_VIOLATIONS: u32 = 9;
    pub(crate) const CHUNKS_COMMITTED_OUT_OF_ORDER: u32 = 11;
    pub(crate) const BUFFER_SIZE: u32 = 12;
    pub(crate) const BYTES_OVERWRITTEN: u32 = 13;
    pub(crate) const BYTES_READ: u32 = 14;
    pub(crate) const PADDING_BYTES_WRITTEN: u32 = 15;
    pub(crate) const CHUNKS_READ: u32 = 17;
    pub(crate) const CHUNKS_DISCARDED: u32 = 18;
    pub(crate) const TRACE_WRITER_PACKET_LOSS: u32 = 19;
    /// The recorder's own counters, far above Perfetto's numbers (which end
    /// at 21) so readers that do not know them skip them: packets and bytes
    /// discarded while the space was pinned by a write pass, then packets
    /// and bytes discarded while every free chunk was held by another writer.
    pub(crate) const RECORDER_OWN: [u32; 4] = [1001, 1002, 1003, 1004];

    /// Every field's name, field `i + 1` at index `i`.
    pub(crate) const NAMES: [&str; 20] = [
        "bytes_written",
        "chunks_written",
        "chunks_overwritten",
        "write_wrap_count",
        "patches_succeeded",
        "patches_failed",
        "readaheads_succeeded",
        "readaheads_failed",
        "abi_violations",
        "chunks_rewritten",
        "chunks_committed_out_of_order",
        "buffer_size",
        "bytes_overwritten",
        "bytes_read",
        "padding_bytes_written",
        "padding_bytes_cleared",
        "chunks_read",
        "chunks_discarded",
        "trace_writer_packet_loss",
        "chunks_relocated",
    ];
}

/// `TraceStats.WriterStats`.
pub(crate) mod writer_stats {
    pub(crate) const SEQUENCE_ID: u32 = 1;
    pub(crate) const BUFFER: u32 = 4;
}

/// `FtraceEventBundle` (ARCHITECTURE.md §7.4).
pub(crate) mod ftrace_event_bundle {
    pub(crate) const CPU: u32 = 1;
    pub(crate) const EVENT: u32 = 2;
    pub(crate) const LOST_EVENTS: u32 = 3;
    pub(crate) const COMPACT_SCHED: u32 = 4;
    pub(crate) const FTRACE_CLOCK: u32 = 5;
    pub(crate) const PREVIOUS_BUNDLE_END_TIMESTAMP: u32 = 10;
}

/// `FtraceEventBundle.CompactSched`: packed columns and the intern table.
pub(crate) mod compact_sched {
    pub(crate) const SWITCH_TIMESTAMP: u32 = 1;
    pub(crate) const SWITCH_PREV_STATE: u32 = 2;
    pub(crate) const SWITCH_NEXT_PID: u32 = 3;
    pub(crate) const SWITCH_NEXT_PRIO: u32 = 4;
    pub(crate) const INTERN_TABLE: u32 = 5;
    pub(crate) const SWITCH_NEXT_COMM_INDEX: u32 = 6;
    pub(crate) const WAKING_TIMESTAMP: u32 = 7;
    pub(crate) const WAKING_PID: u32 = 8;
    pub(crate) const WAKING_TARGET_CPU: u32 = 9;
    pub(crate) const WAKING_PRIO: u32 = 10;
    pub(crate) const WAKING_COMM_INDEX: u32 = 11;
    pub(crate) const WAKING_COMMON_FLAGS: u32 = 12;
}

/// `FtraceEvent`: the common fields and the generic event (the typed
/// events' numbers come with the event table).
pub(crate) mod ftrace_event {
    pub(crate) const TIMESTAMP: u32 = 1;
    pub(crate) const PID: u32 = 2;
    pub(crate) const GENERIC: u32 = 327;
}

/// `GenericFtraceEvent`.
pub(crate) mod generic_ftrace_event {
    pub(crate) const EVENT_NAME: u32 = 1;
    pub(crate) const FIELD: u32 = 2;
}

/// `GenericFtraceEvent.Field`.
pub(crate) mod generic_field {
    pub(crate) const NAME: u32 = 1;
    pub(crate) const STR_VALUE: u32 = 3;
    pub(crate) const INT_VALUE: u32 = 4;
    pub(crate) const UINT_VALUE: u32 = 5;
}

/// `FtraceStats` (ARCHITECTURE.md §7.4).
pub(crate) mod ftrace_stats {
    pub(crate) const PHASE: u32 = 1;
    pub(crate) const CPU_STATS: u32 = 2;
    pub(crate) const UNKNOWN_FTRACE_EVENTS: u32 = 6;
    pub(crate) const FAILED_FTRACE_EVENTS: u32 = 7;
    pub(crate) const PRESERVE_FTRACE_BUFFER: u32 = 8;
    pub(crate) const FTRACE_PARSE_ERRORS: u32 = 9;
    pub(crate) const CPU_BUFFER_SIZE_PAGES: u32 = 11;
}

/// `FtraceCpuStats`.
pub(crate) mod ftrace_cpu_stats {
    pub(crate) const CPU: u32 = 1;
    pub(crate) const ENTRIES: u32 = 2;
    pub(crate) const OVERRUN: u32 = 3;
    pub(crate) const COMMIT_OVERRUN: u32 = 4;
    pub(crate) const BYTES_READ: u32 = 5;
    pub(crate) const OLDEST_EVENT_TS: u32 = 6;
    pub(crate) const NOW_TS: u32 = 7;
    pub(crate) const DROPPED_EVENTS: u32 = 8;
    pub(crate) const READ_EVENTS: u32 = 9;
}

/// `TestEvent` (the `for_testing` payload).
pub(crate) mod test_event {
    pub(crate) const STR: u32 = 1;
    pub(crate) const SEQ_VALUE: u32 = 2;
    pub(crate) const COUNTER: u32 = 3;
    pub(crate) const IS_LAST: u32 = 4;
}

/// `ProcessTree` (ARCHITECTURE.md §7.5).
pub(crate) mod process_tree {
    pub(crate) const PROCESSES: u32 = 1;
    pub(crate) const THREADS: u32 = 2;
    pub(crate) const COLLECTION_END_TIMESTAMP: u32 = 3;
}

/// `ProcessTree.Process`.
pub(crate) mod process_tree_process {
    pub(crate) const PID: u32 = 1;
    pub(crate) const PPID: u32 = 2;
    pub(crate) const CMDLINE: u32 = 3;
    pub(crate) const UID: u32 = 5;
    pub(crate) const NSPID: u32 = 6;
    pub(crate) const PROCESS_START_FROM_BOOT: u32 = 7;
    pub(crate) const IS_KTHREAD: u32 = 8;
    pub(crate) const CMDLINE_IS_COMM: u32 = 9;
}

/// `ProcessTree.Thread`.
pub(crate) mod process_tree_thread {
    pub(crate) const TID: u32 = 1;
    pub(crate) const NAME: u32 = 2;
    pub(crate) const TGID: u32 = 3;
    pub(crate) const NSTID: u32 = 4;
}

/// `ProcessStats` (ARCHITECTURE.md §7.5).
pub(crate) mod process_stats {
    pub(crate) const PROCESSES: u32 = 1;
    pub(crate) const COLLECTION_END_TIMESTAMP: u32 = 2;
}

/// `ProcessStats.Process`.
pub(crate) mod process_stats_process {
    pub(crate) const PID: u32 = 1;
    pub(crate) const VM_SIZE_KB: u32 = 2;
    pub(crate) const VM_RSS_KB: u32 = 3;
    pub(crate) const RSS_ANON_KB: u32 = 4;
    pub(crate) const RSS_FILE_KB: u32 = 5;
    pub(crate) const RSS_SHMEM_KB: u32 = 6;
    pub(crate) const VM_SWAP_KB: u32 = 7;
    pub(crate) const VM_LOCKED_KB: u32 = 8;
    pub(crate) const VM_HWM_KB: u32 = 9;
    pub(crate) const OOM_SCORE_ADJ: u32 = 10;
    pub(crate) const SMR_RSS_KB: u32 = 16;
    pub(crate) const SMR_PSS_KB: u32 = 17;
    pub(crate) const SMR_PSS_ANON_KB: u32 = 18;
    pub(crate) const SMR_PSS_FILE_KB: u32 = 19;
    pub(crate) const SMR_PSS_SHMEM_KB: u32 = 20;
    pub(crate) const RUNTIME_USER_MODE: u32 = 21;
    pub(crate) const RUNTIME_KERNEL_MODE: u32 = 22;
    pub(crate) const SMR_SWAP_PSS_KB: u32 = 23;
}

/// `SysStats` (ARCHITECTURE.md §7.5).
pub(crate) mod sys_stats {
    pub(crate) const MEMINFO: u32 = 1;
    pub(crate) const VMSTAT: u32 = 2;
    pub(crate) const CPU_STAT: u32 = 3;
    pub(crate) const NUM_FORKS: u32 = 4;
    pub(crate) const NUM_IRQ_TOTAL: u32 = 5;
    pub(crate) const NUM_IRQ: u32 = 6;
    pub(crate) const NUM_SOFTIRQ_TOTAL: u32 = 7;
    pub(crate) const NUM_SOFTIRQ: u32 = 8;
    pub(crate) const COLLECTION_END_TIMESTAMP: u32 = 9;
    pub(crate) const DEVFREQ: u32 = 10;
    pub(crate) const CPUFREQ_KHZ: u32 = 11;
    pub(crate) const BUDDY_INFO: u32 = 12;
    pub(crate) const DISK_STAT: u32 = 13;
    pub(crate) const PSI: u32 = 14;
    pub(crate) const THERMAL_ZONE: u32 = 15;
    pub(crate) const CPUIDLE_STATE: u32 = 16;
}

/// The `{key = 1, value = 2}` entries of `SysStats`: meminfo, vmstat,
/// devfreq.
pub(crate) mod key_value {
    pub(crate) const KEY: u32 = 1;
    pub(crate) const VALUE: u32 = 2;
}

/// `SysStats.CpuTimes`: `cpu_id`, then the eight times in `/proc/stat`'s
/// column order, numbered from `USER_NS`.
pub(crate) mod cpu_times {
    pub(crate) const CPU_ID: u32 = 1;
    pub(crate) const USER_NS: u32 = 2;
}

/// `SysStats.InterruptCount`.
pub(crate) mod interrupt_count {
    pub(crate) const IRQ: u32 = 1;
    pub(crate) const COUNT: u32 = 2;
}

/// `SysStats.BuddyInfo`.
pub(crate) mod buddy_info {
    pub(crate) const NODE: u32 = 1;
    pub(crate) const ZONE: u32 = 2;
    pub(crate) const ORDER_PAGES: u32 = 3;
}

/// `SysStats.DiskStat`.
pub(crate) mod disk_stat {
    pub(crate) const DEVICE_NAME: u32 = 1;
    pub(crate) const READ_SECTORS: u32 = 2;
    pub(crate) const READ_TIME_MS: u32 = 3;
    pub(crate) const WRITE_SECTORS: u32 = 4;
    pub(crate) const WRITE_TIME_MS: u32 = 5;
    pub(crate) const DISCARD_SECTORS: u32 = 6;
    pub(crate) const DISCARD_TIME_MS: u32 = 7;
    pub(crate) const FLUSH_COUNT: u32 = 8;
    pub(crate) const FLUSH_TIME_MS: u32 = 9;
}

/// `SysStats.PsiSample`.
pub(crate) mod psi_sample {
    pub(crate) const RESOURCE: u32 = 1;
    pub(crate) const TOTAL_NS: u32 = 2;
}

/// `SysStats.ThermalZone`.
pub(crate) mod thermal_zone {
    pub(crate) const NAME: u32 = 1;
    pub(crate) const TEMP: u32 = 2;
    pub(crate) const TYPE: u32 = 3;
}

/// `SysStats.CpuIdleState`.
pub(crate) mod cpuidle_state {
    pub(crate) const CPU_ID: u32 = 1;
    pub(crate) const CPUIDLE_STATE_ENTRY: u32 = 2;
}

/// `SysStats.CpuIdleStateEntry`.
pub(crate) mod cpuidle_state_entry {
    pub(crate) const STATE: u32 = 1;
    pub(crate) const DURATION_US: u32 = 2;
}

/// `TraceConfig` (ARCHITECTURE.md §7.10), the fields read at wire level.
pub(crate) mod trace_config {
    pub(crate) const DATA_SOURCES: u32 = 2;
    pub(crate) const FLUSH_PERIOD_MS: u32 = 13;
}

/// `TraceConfig.DataSource`.
pub(crate) mod trace_config_data_source {
    pub(crate) const CONFIG: u32 = 1;
}

/// `DataSourceConfig`: the fields the tracing service owns (ARCHITECTURE.md §7.10).
pub(crate) mod data_source_config {
    pub(crate) const TARGET_BUFFER: u32 = 2;
    pub(crate) const TRACE_DURATION_MS: u32 = 3;
    pub(crate) const TRACING_SESSION_ID: u32 = 4;
    pub(crate) const ENABLE_EXTRA_GUARDRAILS: u32 = 6;
    pub(crate) const STOP_TIMEOUT_MS: u32 = 7;
    pub(crate) const SESSION_INITIATOR: u32 = 8;
    pub(crate) const PREFER_SUSPEND_CLOCK_FOR_DURATION: u32 = 122;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Oracle: the descriptors of Perfetto's own protos (the
    /// `perfetto_protos` crate) name the same numbers.
    #[test]
    fn numbers_match_perfetto_protos() {
        use perfetto_protos::trace_packet::TracePacket;
        use protobuf::MessageFull;
        let d = TracePacket::descriptor();
        // The crate predates a few of the newest fields (124 and up); every
        // field it knows must agree.
        let mut known = 0;
        for (n, name) in trace_packet::DATA_NAMES {
            if let Some(f) = d.field_by_number(*n) {
                assert_eq!(f.name(), *name, "TracePacket.{n}");
                known += 1;
            }
        }
        assert!(known >= trace_packet::DATA_NAMES.len() - 5, "{known} known");
        for (n, name) in [
            (trace_packet::TIMESTAMP, "timestamp"),
            (
                trace_packet::TRUSTED_PACKET_SEQUENCE_ID,
                "trusted_packet_sequence_id",
            ),
            (
                trace_packet::PREVIOUS_PACKET_DROPPED,
                "previous_packet_dropped",
            ),
            (
                trace_packet::INCREMENTAL_STATE_CLEARED,
                "incremental_state_cleared",
            ),
            (trace_packet::TIMESTAMP_CLOCK_ID, "timestamp_clock_id"),
            (trace_packet::SEQUENCE_FLAGS, "sequence_flags"),
        ] {
            assert_eq!(
                d.field_by_number(n).map(|f| f.name().to_string()),
                Some(name.to_string())
            );
        }
        let te = perfetto_protos::test_event::TestEvent::descriptor();
        assert_eq!(
            te.field_by_number(test_event::COUNTER)
                .map(|f| f.name().to_string()),
            Some("counter".into())
        );
        let ts = perfetto_protos::trace_stats::trace_stats::BufferStats::descriptor();
        // chunks_relocated (20) is newer than the crate.
        for (i, name) in buffer_stats::NAMES[..19].iter().enumerate() {
            let f = ts.field_by_number(i as u32 + 1);
            assert_eq!(f.map(|f| f.name().to_string()), Some(name.to_string()));
        }
        let st = perfetto_protos::trace_stats::TraceStats::descriptor();
        for (n, name) in trace_stats::SCALAR_NAMES {
            assert_eq!(
                st.field_by_number(*n).map(|f| f.name().to_string()),
                Some(name.to_string())
            );
        }
        let se = perfetto_protos::tracing_service_event::TracingServiceEvent::descriptor();
        for (n, name) in tracing_service_event::NAMES {
            assert_eq!(
                se.field_by_number(*n).map(|f| f.name().to_string()),
                Some(name.to_string())
            );
        }
        for (n, _) in tracing_service_event::RECORDER_NAMES {
            assert!(se.field_by_number(*n).is_none(), "{n} is Perfetto's");
        }
    }
}

//! The events of one recording: each enabled event's layout, resolved once
//! into what the encoder needs (proto field numbers paired with kernel field
//! offsets), indexed by kernel event id.

use super::format::{EventFormat, Field, FieldKind};

/// How a kernel field is written into its typed proto message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoKind {
    /// `int32`/`int64`: sign-extended.
    Int,
    /// `uint32`/`uint64`.
    Uint,
    /// `string`.
    Str,
}

use ProtoKind::{Int as I, Str as S, Uint as U};

/// A typed event Perfetto knows: (group, name, FtraceEvent field, fields).
type TypedSpec = (
    &'static str,
    &'static str,
    u32,
    &'static [(u32, &'static str, ProtoKind)],
);

const WAKEUP_FIELDS: &[(u32, &str, ProtoKind)] = &[
    (1, "comm", S),
    (2, "pid", I),
    (3, "prio", I),
    (4, "success", I),
    (5, "target_cpu", I),
];

/// Field numbers from Perfetto's `ftrace_event.proto` and the per-event
/// messages (facts §4.4).
const TYPED: &[TypedSpec] = &[
    ("ftrace", "print", 3, &[(1, "ip", U), (2, "buf", S)]),
    (
        "sched",
        "sched_switch",
        4,
        &[
            (1, "prev_comm", S),
            (2, "prev_pid", I),
            (3, "prev_prio", I),
            (4, "prev_state", I),
            (5, "next_comm", S),
            (6, "next_pid", I),
            (7, "next_prio", I),
        ],
    ),
    (
        "power",
        "cpu_frequency",
        11,
        &[(1, "state", U), (2, "cpu_id", U)],
    ),
    (
        "power",
        "cpu_frequency_limits",
        12,
        &[(1, "min_freq", U), (2, "max_freq", U), (3, "cpu_id", U)],
    ),
    (
        "power",
        "cpu_idle",
        13,
        &[(1, "state", U), (2, "cpu_id", U)],
    ),
    ("sched", "sched_wakeup", 17, WAKEUP_FIELDS),
    (
        "sched",
        "sched_blocked_reason",
        18,
        &[(1, "pid", I), (2, "caller", U), (3, "io_wait", U)],
    ),
    ("sched", "sched_waking", 20, WAKEUP_FIELDS),
    ("ipi", "ipi_entry", 21, &[(1, "reason", S)]),
    ("ipi", "ipi_exit", 22, &[(1, "reason", S)]),
    ("irq", "softirq_entry", 24, &[(1, "vec", U)]),
    ("irq", "softirq_exit", 25, &[(1, "vec", U)]),
    ("irq", "softirq_raise", 26, &[(1, "vec", U)]),
    (
        "irq",
        "irq_handler_entry",
        36,
        &[(1, "irq", I), (2, "name", S), (3, "handler", U)],
    ),
    (
        "irq",
        "irq_handler_exit",
        37,
        &[(1, "irq", I), (2, "ret", I)],
    ),
    (
        "workqueue",
        "workqueue_execute_start",
        58,
        &[(1, "work", U), (2, "function", U)],
    ),
    (
        "power",
        "suspend_resume",
        113,
        &[(1, "action", S), (2, "val", I), (3, "start", U)],
    ),
    ("sched", "sched_wakeup_new", 114, WAKEUP_FIELDS),
    (
        "task",
        "task_newtask",
        235,
        &[
            (1, "pid", I),
            (2, "comm", S),
            (3, "clone_flags", U),
            (4, "oom_score_adj", I),
        ],
    ),
    (
        "task",
        "task_rename",
        236,
        &[
            (1, "pid", I),
            (2, "oldcomm", S),
            (3, "newcomm", S),
            (4, "oom_score_adj", I),
        ],
    ),
    (
        "sched",
        "sched_process_exec",
        237,
        &[(1, "filename", S), (2, "pid", I), (3, "old_pid", I)],
    ),
    (
        "sched",
        "sched_process_exit",
        238,
        &[
            (1, "comm", S),
            (2, "pid", I),
            (3, "tgid", I),
            (4, "prio", I),
        ],
    ),
    (
        "sched",
        "sched_process_fork",
        239,
        &[
            (1, "parent_comm", S),
            (2, "parent_pid", I),
            (3, "child_comm", S),
            (4, "child_pid", I),
        ],
    ),
    (
        "sched",
        "sched_process_free",
        240,
        &[(1, "comm", S), (2, "pid", I), (3, "prio", I)],
    ),
    (
        "sched",
        "sched_process_hang",
        241,
        &[(1, "comm", S), (2, "pid", I)],
    ),
    (
        "sched",
        "sched_process_wait",
        242,
        &[(1, "comm", S), (2, "pid", I), (3, "prio", I)],
    ),
    (
        "kmem",
        "rss_stat",
        313,
        &[
            (1, "member", I),
            (2, "size", I),
            (3, "curr", U),
            (4, "mm_id", U),
        ],
    ),
    // `args` (an array) is left out.
    ("raw_syscalls", "sys_enter", 329, &[(1, "id", I)]),
    (
        "raw_syscalls",
        "sys_exit",
        330,
        &[(1, "id", I), (2, "ret", I)],
    ),
    (
        "oom",
        "oom_score_adj_update",
        326,
        &[(1, "comm", S), (2, "oom_score_adj", I), (3, "pid", I)],
    ),
];

/// Kernel fields that name a thread worth describing (process_stats).
const PID_FIELDS: &[&str] = &["pid", "prev_pid", "next_pid", "parent_pid", "child_pid"];

/// Whether Perfetto has a typed message for `group/name`.
pub fn is_typed(group: &str, name: &str) -> bool {
    TYPED.iter().any(|t| t.0 == group && t.1 == name)
}

/// A typed event's encoding plan.
#[derive(Clone, Debug)]
pub struct TypedPlan {
    /// Field of `FtraceEvent` holding the message.
    pub proto_field: u32,
    pub fields: Vec<(u32, ProtoKind, Field)>,
}

/// The fields compact_sched needs from sched_switch.
#[derive(Clone, Debug)]
pub struct SwitchPlan {
    pub prev_state: Field,
    pub next_pid: Field,
    pub next_prio: Field,
    pub next_comm: Field,
}

/// The fields compact_sched needs from sched_waking.
#[derive(Clone, Debug)]
pub struct WakingPlan {
    pub pid: Field,
    pub target_cpu: Field,
    pub prio: Field,
    pub comm: Field,
    pub common_flags: Option<Field>,
}

/// Which compact form an event takes when compact_sched is on.
#[derive(Clone, Debug)]
pub enum CompactPlan {
    Switch(SwitchPlan),
    Waking(WakingPlan),
}

/// Everything known about one event id.
#[derive(Clone, Debug)]
pub struct EventEntry {
    pub format: EventFormat,
    pub typed: Option<TypedPlan>,
    pub compact: Option<CompactPlan>,
    pub pid: Option<Field>,
    /// Integer fields naming threads (for process_stats).
    pub pid_fields: Vec<Field>,
    /// `ftrace/print`, subject to the print filter.
    pub is_print: bool,
}

/// Event entries by kernel id.
#[derive(Clone, Debug, Default)]
pub struct EventTable {
    by_id: Vec<Option<EventEntry>>,
    /// Where the id sits in every record (`common_type`).
    id_field: Option<Field>,
}

fn int_field(f: &EventFormat, name: &str) -> Option<Field> {
    f.field(name).filter(|x| x.kind == FieldKind::Int).cloned()
}

fn text_field(f: &EventFormat, name: &str) -> Option<Field> {
    f.field(name)
        .filter(|x| {
            matches!(
                x.kind,
                FieldKind::CharArray | FieldKind::DataLoc | FieldKind::TailString
            )
        })
        .cloned()
}

impl EventTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an event; `compact_sched` selects the compact plans.
    pub fn insert(&mut self, format: EventFormat, compact_sched: bool) {
        let typed = TYPED
            .iter()
            .find(|t| t.0 == format.group && t.1 == format.name)
            .map(|t| TypedPlan {
                proto_field: t.2,
                fields: t
                    .3
                    .iter()
                    .filter_map(|&(no, name, kind)| {
                        let f = format.field(name)?;
                        let ok = match kind {
                            ProtoKind::Str => matches!(
                                f.kind,
                                FieldKind::CharArray | FieldKind::DataLoc | FieldKind::TailString
                            ),
                            _ => f.kind == FieldKind::Int,
                        };
                        ok.then(|| (no, kind, f.clone()))
                    })
                    .collect(),
            });
        let compact = if !compact_sched || format.group != "sched" {
            None
        } else if format.name == "sched_switch" {
            (|| {
                Some(CompactPlan::Switch(SwitchPlan {
                    prev_state: int_field(&format, "prev_state")?,
                    next_pid: int_field(&format, "next_pid")?,
                    next_prio: int_field(&format, "next_prio")?,
                    next_comm: text_field(&format, "next_comm")?,
                }))
            })()
        } else if format.name == "sched_waking" {
            (|| {
                Some(CompactPlan::Waking(WakingPlan {
                    pid: int_field(&format, "pid")?,
                    target_cpu: int_field(&format, "target_cpu")?,
                    prio: int_field(&format, "prio")?,
                    comm: text_field(&format, "comm")?,
                    common_flags: int_field(&format, "common_flags"),
                }))
            })()
        } else {
            None
        };
        if self.id_field.is_none() {
            self.id_field = format.field("common_type").cloned();
        }
        let pid = int_field(&format, "common_pid");
        let pid_fields = if typed.is_some() {
            PID_FIELDS
                .iter()
                .filter_map(|n| int_field(&format, n))
                .collect()
        } else {
            Vec::new()
        };
        let is_print = format.group == "ftrace" && format.name == "print";
        let id = format.id as usize;
        if self.by_id.len() <= id {
            self.by_id.resize(id + 1, None);
        }
        self.by_id[id] = Some(EventEntry {
            format,
            typed,
            compact,
            pid,
            pid_fields,
            is_print,
        });
    }

    /// The id of a record, read where `common_type` lives.
    #[inline]
    pub fn event_id(&self, rec: &[u8]) -> Option<u16> {
        match &self.id_field {
            Some(f) => super::format::read_uint(rec, f.offset, f.size).map(|v| v as u16),
            None => super::format::read_uint(rec, 0, 2).map(|v| v as u16),
        }
    }

    #[inline]
    pub fn get(&self, id: u16) -> Option<&EventEntry> {
        self.by_id.get(id as usize).and_then(Option::as_ref)
    }

    pub fn len(&self) -> usize {
        self.by_id.iter().filter(|e| e.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

//! The events of one recording: each enabled event's layout, resolved once
//! into what the encoder needs, indexed by kernel event id. A plan is a
//! short list of small `Copy` steps (where a field sits in the record, how
//! wide it is, the proto key to write it under, already encoded), so the
//! encoder's loop per event reads no names, sizes or kinds from the format.
//!
//! ```text
//!  events/sched/sched_wakeup/format        plan (TypedPlan)
//!   char comm[16]  offset:8  size:16  ──►  Str  { key 0x0a,  Comm16 @8 }
//!   pid_t pid      offset:24 size:4   ──►  Int  { key 0x10,  I32 @24 }
//!   int prio       offset:28 size:4   ──►  Int  { key 0x18,  I32 @28 }
//!   int target_cpu offset:32 size:4   ──►  Int  { key 0x28,  I32 @32 }
//! ```
//!
//! sched_wakeup and sched_waking, the most frequent typed events, also get
//! a [`WakeupPlan`]: the same four steps held as named fields, so their
//! encoder is straight-line code with one length check per record.

use super::format::{EventFormat, Field, FieldKind, read_uint, until_nul};
use crate::wire::{PackedKey, WireType, varint};

/// How a kernel field is written into its typed proto message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProtoKind {
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
/// messages (ARCHITECTURE.md §7.4).
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
pub(crate) fn is_typed(group: &str, name: &str) -> bool {
    TYPED.iter().any(|t| t.0 == group && t.1 == name)
}

/// Where an integer field sits in a record and how it is read, resolved
/// once from its format line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntAt {
    /// Byte offset of the field in the record.
    pub offset: usize,
    /// 1, 2, 4 or 8.
    pub size: u8,
    /// The format file says `signed:1`: the value is sign-extended.
    pub signed: bool,
    /// The field is read from the 8-byte word ending here: at its own end,
    /// or at byte 8 for a field in the first 8 (the common header).
    word_end: usize,
    /// Bits of the word above the field, shifted out first.
    up: u8,
    /// `64 − 8·size`: then brings the field down from the top of the word.
    down: u8,
}

impl IntAt {
    /// The field's place, if it is an integer.
    pub fn of(f: &Field) -> Option<Self> {
        if f.kind != FieldKind::Int || !matches!(f.size, 1 | 2 | 4 | 8) {
            return None;
        }
        let end = f.offset.checked_add(f.size)?;
        let word_end = end.max(8);
        Some(Self {
            offset: f.offset,
            size: f.size as u8,
            signed: f.signed,
            word_end,
            up: (8 * (word_end - end)) as u8,
            down: (64 - 8 * f.size) as u8,
        })
    }

    /// The word holding the field, with the field in its top bytes; `None`
    /// when the record is shorter than the word.
    #[inline(always)]
    fn word(self, rec: &[u8]) -> Option<u64> {
        let w = rec.get(..self.word_end)?.last_chunk::<8>()?;
        Some(u64::from_le_bytes(*w) << self.up)
    }

    /// The raw little-endian value (no sign extension).
    #[inline(always)]
    pub(crate) fn uint(self, rec: &[u8]) -> Option<u64> {
        // Branch-free for any width; only a record shorter than 8 bytes
        // takes the byte-wise read.
        match self.word(rec) {
            Some(w) => Some(w >> self.down),
            None => read_uint(rec, self.offset, self.size as usize),
        }
    }

    /// The value, sign-extended when the field is signed.
    #[inline(always)]
    pub fn int(self, rec: &[u8]) -> Option<i64> {
        match self.word(rec) {
            Some(w) if self.signed => Some((w as i64) >> self.down),
            Some(w) => Some((w >> self.down) as i64),
            None => {
                let v = read_uint(rec, self.offset, self.size as usize)?;
                Some(if self.signed && self.size < 8 {
                    let shift = 64 - 8 * u32::from(self.size);
                    ((v << shift) as i64) >> shift
                } else {
                    v as i64
                })
            }
        }
    }
}

/// Where a text field sits in a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextAt {
    /// `char name[16]` (comms): read as one 16-byte word.
    Comm16(usize),
    /// `char name[N]`, N ≠ 16: `size` bytes, NUL-padded.
    Array {
        /// Byte offset of the array in the record.
        offset: usize,
        /// Its declared length, `N`.
        size: usize,
    },
    /// `__data_loc char[] name`: a u32 at `offset` holding `len << 16 | at`.
    DataLoc(usize),
    /// `char name[]`: the rest of the record.
    Tail(usize),
}

impl TextAt {
    /// The field's place, if it is text.
    pub fn of(f: &Field) -> Option<Self> {
        Some(match f.kind {
            FieldKind::CharArray if f.size == 16 => Self::Comm16(f.offset),
            FieldKind::CharArray => Self::Array {
                offset: f.offset,
                size: f.size,
            },
            FieldKind::DataLoc => Self::DataLoc(f.offset),
            FieldKind::TailString => Self::Tail(f.offset),
            FieldKind::Int | FieldKind::Opaque => return None,
        })
    }

    /// The text up to its first NUL (what `format::read_str` gives).
    #[inline]
    pub fn read(self, rec: &[u8]) -> Option<&[u8]> {
        let raw = match self {
            Self::Comm16(at) => {
                let (_, n) = comm16(rec, at)?;
                return rec.get(at..at + n);
            }
            Self::Array { offset, size } => rec.get(offset..offset.checked_add(size)?)?,
            Self::Tail(at) => rec.get(at..)?,
            Self::DataLoc(at) => {
                let loc = read_uint(rec, at, 4)? as u32;
                let off = (loc & 0xffff) as usize;
                let len = (loc >> 16) as usize;
                rec.get(off..off + len)?
            }
        };
        Some(until_nul(raw))
    }
}

/// The 16 bytes at `at` as one word with the bytes from the first NUL on
/// cleared, and the count before it (≤ 16).
#[inline(always)]
pub(crate) fn comm16(rec: &[u8], at: usize) -> Option<(u128, usize)> {
    const LO: u128 = u128::from_le_bytes([1; 16]);
    const HI: u128 = u128::from_le_bytes([0x80; 16]);
    let v = u128::from_le_bytes(*rec.get(at..)?.first_chunk::<16>()?);
    // The lowest set bit marks the first zero byte (the haszero test).
    let zero = v.wrapping_sub(LO) & !v & HI;
    if zero == 0 {
        return Some((v, 16));
    }
    // Its lowest set bit is exact (borrows only run upwards): every bit
    // below it is the comm's bytes and the zero byte's own clear low bits.
    let below = (zero & zero.wrapping_neg()) - 1;
    Some((v & below, (zero.trailing_zeros() / 8) as usize))
}

/// One field of a typed message: its key, encoded once, and where its
/// value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypedOp {
    /// `int32`/`int64`: sign-extended.
    Int(PackedKey, IntAt),
    /// `uint32`/`uint64`.
    Uint(PackedKey, IntAt),
    /// `string`.
    Str(PackedKey, TextAt),
}

/// A typed event's encoding plan.
#[derive(Clone, Debug)]
pub struct TypedPlan {
    /// Key of the `FtraceEvent` field holding the message.
    pub key: PackedKey,
    /// The message's fields, each with where its value sits in the record.
    pub ops: Vec<TypedOp>,
    /// The most bytes the message takes, key and length included, when
    /// every field is bounded (integers, comms); `None` with other text.
    pub max_len: Option<usize>,
}

impl TypedPlan {
    fn new(key: PackedKey, ops: Vec<TypedOp>) -> Self {
        let fields = ops.iter().try_fold(0, |sum, op| {
            Some(
                sum + match op {
                    TypedOp::Int(k, _) | TypedOp::Uint(k, _) => {
                        k.as_bytes().len() + varint::MAX_LEN
                    }
                    TypedOp::Str(k, TextAt::Comm16(_)) => k.as_bytes().len() + 1 + 16,
                    TypedOp::Str(..) => return None,
                },
            )
        });
        // The message's own key, and a one-byte length (it stays under 128
        // bytes wherever this bound is used).
        let max_len = fields.map(|f| key.as_bytes().len() + 1 + f);
        Self { key, ops, max_len }
    }
}

/// The fields compact_sched needs from sched_switch.
#[derive(Clone, Copy, Debug)]
pub struct SwitchPlan {
    /// `prev_state`: the state of the task switched out.
    pub prev_state: IntAt,
    /// `next_pid`: the thread switched in.
    pub next_pid: IntAt,
    /// `next_prio`: its priority.
    pub next_prio: IntAt,
    /// `next_comm`: its name, interned per bundle.
    pub next_comm: TextAt,
}

/// The fields compact_sched needs from sched_waking.
#[derive(Clone, Copy, Debug)]
pub struct WakingPlan {
    /// `pid`: the thread woken.
    pub pid: IntAt,
    /// `target_cpu`: the CPU it is to run on.
    pub target_cpu: IntAt,
    /// `prio`: its priority.
    pub prio: IntAt,
    /// `comm`: its name, interned per bundle.
    pub comm: TextAt,
    pub(crate) common_flags: Option<IntAt>,
}

/// sched_wakeup and sched_waking as their typed messages, straight-line:
/// the four fields of the typed plan (comm, pid, prio, target_cpu, in its
/// order and under its keys), taken from it once at set-up so the encoder
/// walks no op list for the most frequent typed event.
#[derive(Clone, Copy, Debug)]
pub struct WakeupPlan {
    /// Key of the `FtraceEvent` field holding the message.
    pub key: PackedKey,
    /// `comm`'s key, and the offset of its 16 bytes in the record.
    pub comm: (PackedKey, usize),
    /// `pid`'s key, and where the field sits.
    pub pid: (PackedKey, IntAt),
    /// `prio`'s key, and where the field sits.
    pub prio: (PackedKey, IntAt),
    /// `target_cpu`'s key, and where the field sits.
    pub target_cpu: (PackedKey, IntAt),
    /// Records at least this long hold every field (and `common_pid`)
    /// whole; shorter ones take the typed plan.
    pub min_len: usize,
}

impl WakeupPlan {
    /// The plan, when `typed` is exactly comm (16 bytes) and three integers.
    fn of(typed: &TypedPlan, common_pid: Option<IntAt>) -> Option<Self> {
        let [
            TypedOp::Str(ck, TextAt::Comm16(comm)),
            TypedOp::Int(pk, pid),
            TypedOp::Int(rk, prio),
            TypedOp::Int(tk, target_cpu),
        ] = typed.ops[..]
        else {
            return None;
        };
        let min_len = [pid, prio, target_cpu]
            .into_iter()
            .chain(common_pid)
            .map(|f| f.word_end)
            .fold(comm + 16, usize::max);
        Some(Self {
            key: typed.key,
            comm: (ck, comm),
            pid: (pk, pid),
            prio: (rk, prio),
            target_cpu: (tk, target_cpu),
            min_len,
        })
    }
}

/// Which compact form an event takes when compact_sched is on.
#[derive(Clone, Copy, Debug)]
pub enum CompactPlan {
    /// sched_switch, as a row of compact_sched's switch columns.
    Switch(SwitchPlan),
    /// sched_waking, as a row of compact_sched's waking columns.
    Waking(WakingPlan),
}

/// Everything known about one event id.
#[derive(Clone, Debug)]
pub struct EventEntry {
    /// The event's parsed `format` file.
    pub format: EventFormat,
    /// Its typed message's plan; `None` writes it as a generic event.
    pub typed: Option<TypedPlan>,
    /// Its compact_sched form: only sched_switch and sched_waking, with
    /// compact_sched on and the fields it needs present.
    pub compact: Option<CompactPlan>,
    /// sched_wakeup/sched_waking written by their own encoder (the same
    /// bytes as `typed`), when their only `pid_fields` entry is its pid.
    pub wakeup: Option<WakeupPlan>,
    /// `common_pid`.
    pub pid: Option<IntAt>,
    /// Integer fields naming threads (for process_stats), in
    /// `PID_FIELDS` order; the thread filter checks them too.
    pub(crate) pid_fields: Vec<IntAt>,
    /// `ftrace/print`'s text, subject to the print filter.
    pub(crate) print_buf: Option<TextAt>,
    /// Rules watch it: the index + 1 of its hooks in the encoder's
    /// `super::watch::Watch` (0: none).
    pub watch: u16,
}

/// Event entries by kernel id.
#[derive(Clone, Debug, Default)]
pub struct EventTable {
    by_id: Vec<Option<EventEntry>>,
    /// Where the id sits in every record (`common_type`).
    id_field: Option<IntAt>,
}

fn int_field(f: &EventFormat, name: &str) -> Option<IntAt> {
    f.field(name).and_then(IntAt::of)
}

fn text_field(f: &EventFormat, name: &str) -> Option<TextAt> {
    f.field(name).and_then(TextAt::of)
}

impl EventTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an event; `compact_sched` selects the compact plans.
    pub fn insert(&mut self, format: EventFormat, compact_sched: bool) {
        let typed = TYPED
            .iter()
            .find(|t| t.0 == format.group && t.1 == format.name)
            .map(|t| {
                let ops = t
                    .3
                    .iter()
                    .filter_map(|&(no, name, kind)| {
                        let f = format.field(name)?;
                        Some(match kind {
                            ProtoKind::Str => {
                                TypedOp::Str(PackedKey::new(no, WireType::Len), TextAt::of(f)?)
                            }
                            ProtoKind::Int => {
                                TypedOp::Int(PackedKey::new(no, WireType::Varint), IntAt::of(f)?)
                            }
                            ProtoKind::Uint => {
                                TypedOp::Uint(PackedKey::new(no, WireType::Varint), IntAt::of(f)?)
                            }
                        })
                    })
                    .collect();
                TypedPlan::new(PackedKey::new(t.2, WireType::Len), ops)
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
            self.id_field = format.field("common_type").and_then(IntAt::of);
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
        // The wakeup encoder notes its pid field as the one thread named.
        let wakeup = typed
            .as_ref()
            .filter(|_| {
                format.group == "sched"
                    && matches!(format.name.as_str(), "sched_wakeup" | "sched_waking")
            })
            .and_then(|t| WakeupPlan::of(t, pid))
            .filter(|w| pid_fields[..] == [w.pid.1]);
        let print_buf = (format.group == "ftrace" && format.name == "print")
            .then(|| text_field(&format, "buf"))
            .flatten();
        let id = format.id as usize;
        if self.by_id.len() <= id {
            self.by_id.resize(id + 1, None);
        }
        self.by_id[id] = Some(EventEntry {
            format,
            typed,
            compact,
            wakeup,
            pid,
            pid_fields,
            print_buf,
            watch: 0,
        });
    }

    /// The entry of `group/name`, with its id.
    pub fn find(&self, group: &str, name: &str) -> Option<(u16, &EventEntry)> {
        self.by_id.iter().enumerate().find_map(|(id, e)| {
            e.as_ref()
                .filter(|e| e.format.group == group && e.format.name == name)
                .map(|e| (id as u16, e))
        })
    }

    /// Marks event `id` as watched by rules: `watch` is the index + 1 of
    /// its hooks in the watch.
    pub fn set_watch(&mut self, id: u16, watch: u16) {
        if let Some(Some(e)) = self.by_id.get_mut(id as usize) {
            e.watch = watch;
        }
    }

    /// The id of a record, read where `common_type` lives.
    #[inline(always)]
    pub fn event_id(&self, rec: &[u8]) -> Option<u16> {
        match self.id_field {
            Some(f) => f.uint(rec).map(|v| v as u16),
            None => read_uint(rec, 0, 2).map(|v| v as u16),
        }
    }

    /// The entry of event `id`, if it was inserted.
    #[inline]
    pub fn get(&self, id: u16) -> Option<&EventEntry> {
        self.by_id.get(id as usize).and_then(Option::as_ref)
    }

    /// How many events the table holds.
    pub fn len(&self) -> usize {
        self.by_id.iter().filter(|e| e.is_some()).count()
    }

    /// Whether the table holds no event.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::ftrace::format::{read_int, read_str};
    use proptest::prelude::*;

    fn field(kind: FieldKind, offset: usize, size: usize, signed: bool) -> Field {
        Field {
            name: "f".into(),
            type_name: String::new(),
            offset,
            size,
            signed,
            kind,
        }
    }

    /// Oracle: Perfetto's own descriptors (the `perfetto_protos` crate) give
    /// every typed event the FtraceEvent field number the table writes it
    /// under, and every field its number and a wire type its kind encodes
    /// (varint for integers, length-delimited for strings).
    #[test]
    fn typed_events_match_perfetto_protos() {
        use perfetto_protos::ftrace_event::FtraceEvent;
        use protobuf::MessageFull;
        use protobuf::descriptor::field_descriptor_proto::Type;
        use protobuf::reflect::{RuntimeFieldType, RuntimeType};
        let event = FtraceEvent::descriptor();
        let mut fields = 0;
        for (group, name, number, spec) in TYPED {
            let f = event
                .field_by_number(*number)
                .unwrap_or_else(|| panic!("FtraceEvent has no field {number} ({group}/{name})"));
            assert_eq!(f.name(), *name, "FtraceEvent.{number}");
            let RuntimeFieldType::Singular(RuntimeType::Message(msg)) = f.runtime_field_type()
            else {
                panic!("FtraceEvent.{name} is not a message");
            };
            for (n, field, kind) in *spec {
                let d = msg
                    .field_by_number(*n)
                    .unwrap_or_else(|| panic!("{}: no field {n} ({field})", msg.name()));
                assert_eq!(d.name(), *field, "{}.{n}", msg.name());
                let ty = d.proto().type_();
                let fits = match kind {
                    ProtoKind::Str => ty == Type::TYPE_STRING,
                    ProtoKind::Int => matches!(ty, Type::TYPE_INT32 | Type::TYPE_INT64),
                    ProtoKind::Uint => matches!(ty, Type::TYPE_UINT32 | Type::TYPE_UINT64),
                };
                assert!(
                    fits,
                    "{}.{field} is {ty:?}, written as {kind:?}",
                    msg.name()
                );
                fields += 1;
            }
        }
        assert!(
            TYPED.len() >= 30 && fields >= 76,
            "{} events, {fields} fields",
            TYPED.len()
        );
    }

    proptest! {
        /// The resolved reads give what the field-by-field reads of
        /// `format` give, for any record bytes and any place.
        #[test]
        fn resolved_reads_match_the_format_reads(
            rec in proptest::collection::vec(prop_oneof![Just(0u8), Just(0x80u8), Just(0xffu8), any::<u8>()], 0..48),
            offset in 0usize..40,
            size_pick in 0usize..4,
            signed in any::<bool>(),
            text_size in prop_oneof![Just(16usize), 0usize..24],
        ) {
            let size = [1, 2, 4, 8][size_pick];
            let f = field(FieldKind::Int, offset, size, signed);
            let at = IntAt::of(&f).expect("an integer");
            prop_assert_eq!(at.int(&rec), read_int(&rec, &f));
            prop_assert_eq!(at.uint(&rec), read_uint(&rec, offset, size));
            for kind in [FieldKind::CharArray, FieldKind::DataLoc, FieldKind::TailString] {
                let f = field(kind, offset, if kind == FieldKind::DataLoc { 4 } else { text_size }, false);
                let t = TextAt::of(&f).expect("text");
                prop_assert_eq!(t.read(&rec), read_str(&rec, &f));
            }
        }
    }
}

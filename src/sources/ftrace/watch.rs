//! Rules evaluated where ftrace events are decoded: each filter compiled
//! against its event's format into a [`Program`] over the raw record (the
//! offsets `format` read from tracefs), called for the events that have
//! rules and for no others (`EventEntry::watch`). The encoder's fast walk
//! over a page hands over its watched events at its end
//! ([`Watch::on_walk`]); each hook then runs over all of them, a filter one
//! comparison at a time, so the kind of a hook or a comparison is matched
//! once per walk, not once per event.
//!
//! An `event` rule fires as the walk that decoded its event ends. Latency
//! rules pair two events of one thread (a wakeup and the switch that puts
//! it on a CPU) or one key (a span's begin and end), which may come from
//! different CPUs: the reader drains the CPUs one after the other, so
//! those events are kept first. At the end of each drain they are put in
//! time order (each CPU's run is already in order) and those older than
//! the drain's start are paired: every CPU's buffer has been read past that time by
//! then (a drain reads each CPU until the page the kernel is writing).
//! The rest wait for the next drain; the last drain pairs everything.

use std::collections::HashMap;

use super::event_table::{EventTable, IntAt, TextAt, comm16};
use super::format::{EventFormat, FieldKind, parse_event_format};
use super::tracefs::Tracefs;
use crate::config::diagnostic::closest;
use crate::config::rule::filter::{glob_match, kernel_int};
use crate::config::rule::{
    Condition, Filter, FilterExpr, FilterOp, FilterValue, Rule, RuleError, Span,
};
use crate::sources::rules::{Limiter, RulePlan};

/// Threads (or span keys) awaiting their end at most per rule: beyond, the
/// oldest half is forgotten (a thread woken and never run is rare).
const MAX_PENDING: usize = 1 << 16;
/// Span stamps held for ordering at most; beyond, they are paired as they
/// stand.
const MAX_ORDERED: usize = 1 << 18;
/// A latency rule's packed stamps held at most (8 MiB); beyond, they are
/// paired as they stand.
const MAX_HELD: usize = 1 << 20;

/// Hashes thread ids and span keys: one multiply (the maps are the
/// recorder's own, keyed by what the kernel recorded).
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_i64(&mut self, v: i64) {
        self.0 = (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type KeyMap = HashMap<i64, u64, std::hash::BuildHasherDefault<KeyHasher>>;

/// A compiled filter.
#[derive(Clone, Debug)]
pub(crate) struct Program(Node);

#[derive(Clone, Debug)]
enum Node {
    /// Every one (an `&&` chain).
    All(Vec<Node>),
    /// Any one (an `||` chain).
    Any(Vec<Node>),
    Not(Box<Node>),
    Int {
        at: IntAt,
        test: IntTest,
    },
    /// The CPU the event was recorded on.
    Cpu(IntTest),
    /// `==`/`!=` on a 16-byte name (comms): one 16-byte compare.
    Comm {
        at: usize,
        word: u128,
        len: usize,
        equal: bool,
    },
    /// `~ "abc*"` on a 16-byte name: its first bytes, masked, compared.
    CommPrefix {
        at: usize,
        word: u128,
        mask: u128,
    },
    Text {
        at: TextAt,
        m: Match,
    },
}

/// Every integer comparison as one test without branches on the operator:
/// the value, its sign bit flipped for signed fields (so that unsigned
/// order is signed order) and masked for `&`, lies in `[lo, lo + span]`,
/// or (`negate`) does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IntTest {
    bias: u64,
    mask: u64,
    lo: u64,
    span: u64,
    negate: bool,
}

impl IntTest {
    /// `field OP value` for a field read as `raw` (sign-extended when
    /// `signed`); `value` fits the field's signedness.
    fn new(op: FilterOp, value: i128, signed: bool) -> IntTest {
        const SIGN: u64 = 1 << 63;
        let bias = if signed { SIGN } else { 0 };
        let v = (value as i64 as u64) ^ bias;
        let range = |lo: u64, hi: u64| IntTest {
            bias,
            mask: u64::MAX,
            lo,
            span: hi - lo,
            negate: false,
        };
        // Empty: nothing is outside the full range.
        let never = IntTest {
            negate: true,
            ..range(0, u64::MAX)
        };
        match op {
            FilterOp::Eq => range(v, v),
            FilterOp::Ne => IntTest {
                negate: true,
                ..range(v, v)
            },
            FilterOp::Lt if v == 0 => never,
            FilterOp::Lt => range(0, v - 1),
            FilterOp::Le => range(0, v),
            FilterOp::Gt if v == u64::MAX => never,
            FilterOp::Gt => range(v + 1, u64::MAX),
            FilterOp::Ge => range(v, u64::MAX),
            FilterOp::BitAnd => IntTest {
                bias: 0,
                mask: value as i64 as u64,
                lo: 1,
                span: u64::MAX - 1,
                negate: false,
            },
            FilterOp::Glob => never,
        }
    }

    #[inline(always)]
    fn test(self, raw: u64) -> bool {
        (((raw ^ self.bias) & self.mask).wrapping_sub(self.lo) <= self.span) != self.negate
    }
}

/// How text is matched, the glob's common shapes taken apart once.
#[derive(Clone, Debug)]
enum Match {
    Equal(Vec<u8>),
    NotEqual(Vec<u8>),
    /// `abc*`.
    Prefix(Vec<u8>),
    /// `*abc`.
    Suffix(Vec<u8>),
    /// `*abc*`.
    Contains(Vec<u8>),
    Glob(Vec<u8>),
}

impl Match {
    fn of(op: FilterOp, pattern: &[u8]) -> Match {
        match op {
            FilterOp::Eq => return Match::Equal(pattern.to_vec()),
            FilterOp::Ne => return Match::NotEqual(pattern.to_vec()),
            _ => {}
        }
        let lead = pattern.starts_with(b"*");
        let inner = if lead { &pattern[1..] } else { pattern };
        let trail = inner.ends_with(b"*");
        let inner = if trail {
            &inner[..inner.len() - 1]
        } else {
            inner
        };
        if inner.iter().any(|c| matches!(c, b'*' | b'?' | b'[')) {
            return Match::Glob(pattern.to_vec());
        }
        match (lead, trail) {
            (false, false) => Match::Equal(inner.to_vec()),
            (false, true) => Match::Prefix(inner.to_vec()),
            (true, false) => Match::Suffix(inner.to_vec()),
            (true, true) => Match::Contains(inner.to_vec()),
        }
    }

    #[inline]
    fn test(&self, s: &[u8]) -> bool {
        match self {
            Match::Equal(p) => s == p.as_slice(),
            Match::NotEqual(p) => s != p.as_slice(),
            Match::Prefix(p) => s.starts_with(p),
            Match::Suffix(p) => s.ends_with(p),
            Match::Contains(p) => p.is_empty() || s.windows(p.len()).any(|w| w == p.as_slice()),
            Match::Glob(p) => glob_match(p, s),
        }
    }
}

impl Program {
    /// Whether the record `rec`, read on `cpu`, passes. The common shapes
    /// (one comparison, an `&&` or `||` chain of them) are tested in line;
    /// only nested ones recurse.
    #[inline]
    pub(crate) fn eval(&self, rec: &[u8], cpu: u32) -> bool {
        match &self.0 {
            Node::All(xs) => xs.iter().all(|x| x.test(rec, cpu)),
            Node::Any(xs) => xs.iter().any(|x| x.test(rec, cpu)),
            n => n.test(rec, cpu),
        }
    }
}

impl Node {
    /// A comparison, in line; anything nested, out of line.
    #[inline(always)]
    fn test(&self, rec: &[u8], cpu: u32) -> bool {
        match self {
            Node::Int { at, test } => at.int(rec).is_some_and(|v| test.test(v as u64)),
            Node::Comm {
                at,
                word,
                len,
                equal,
            } => comm16(rec, *at).is_some_and(|(w, n)| (w == *word && n == *len) == *equal),
            Node::CommPrefix { at, word, mask } => {
                comm16(rec, *at).is_some_and(|(w, _)| w & *mask == *word)
            }
            Node::Cpu(test) => test.test(u64::from(cpu)),
            Node::Text { at, m } => at.read(rec).is_some_and(|s| m.test(s)),
            _ => self.eval(rec, cpu),
        }
    }

    #[inline(never)]
    fn eval(&self, rec: &[u8], cpu: u32) -> bool {
        match self {
            Node::All(xs) => xs.iter().all(|x| x.test(rec, cpu)),
            Node::Any(xs) => xs.iter().any(|x| x.test(rec, cpu)),
            Node::Not(a) => !a.test(rec, cpu),
            n => n.test(rec, cpu),
        }
    }

    /// `a && b` (or `a || b`), chains flattened.
    fn join(all: bool, a: Node, b: Node) -> Node {
        let mut xs = Vec::new();
        for n in [a, b] {
            match n {
                Node::All(v) if all => xs.extend(v),
                Node::Any(v) if !all => xs.extend(v),
                n => xs.push(n),
            }
        }
        if all { Node::All(xs) } else { Node::Any(xs) }
    }
}

/// One comparison of a flattened filter, self-contained so that an event's
/// checks lie in one run of memory: what the hot path reads per event is a
/// few adjacent words, not a chain of pointers.
#[derive(Clone, Copy, Debug)]
enum Leaf {
    Int {
        at: IntAt,
        test: IntTest,
    },
    Comm {
        at: usize,
        word: u128,
        len: usize,
        equal: bool,
    },
    CommPrefix {
        at: usize,
        word: u128,
        mask: u128,
    },
    Cpu(IntTest),
    /// Text or a nested expression: the tree of this index.
    Tree(usize),
}

impl Leaf {
    fn of(n: Node, trees: &mut Vec<Node>) -> Leaf {
        match n {
            Node::Int { at, test } => Leaf::Int { at, test },
            Node::Comm {
                at,
                word,
                len,
                equal,
            } => Leaf::Comm {
                at,
                word,
                len,
                equal,
            },
            Node::CommPrefix { at, word, mask } => Leaf::CommPrefix { at, word, mask },
            Node::Cpu(t) => Leaf::Cpu(t),
            n => {
                trees.push(n);
                Leaf::Tree(trees.len() - 1)
            }
        }
    }
}

impl Leaf {
    /// Tests the events `idx` of `evs` (records in `bytes`), telling `on`
    /// each one's index and result: the leaf's kind is matched once, not
    /// per event.
    #[inline(always)]
    fn sift(
        &self,
        trees: &[Node],
        bytes: &[u8],
        cpu: u32,
        evs: &[Seen],
        idx: impl Iterator<Item = u32>,
        mut on: impl FnMut(u32, bool),
    ) {
        let rec = |k: u32| evs.get(k as usize).map_or(&[][..], |e| e.rec(bytes));
        match *self {
            // The common widths read as themselves, with no shifts by the
            // field's place.
            Leaf::Int { at, test } => match (at.size, at.signed) {
                (4, true) => sift_field(evs, bytes, at.offset, idx, &mut on, |b| {
                    test.test(i64::from(i32::from_le_bytes(b)) as u64)
                }),
                (4, false) => sift_field(evs, bytes, at.offset, idx, &mut on, |b| {
                    test.test(u64::from(u32::from_le_bytes(b)))
                }),
                (8, _) => sift_field(evs, bytes, at.offset, idx, &mut on, |b| {
                    test.test(u64::from_le_bytes(b))
                }),
                _ => {
                    for k in idx {
                        on(k, at.int(rec(k)).is_some_and(|v| test.test(v as u64)));
                    }
                }
            },
            // The name's bytes and the NUL after them (none after 16): one
            // masked compare of the raw 16 bytes.
            Leaf::Comm {
                at,
                word,
                len,
                equal,
            } => {
                let mask = u128::MAX
                    .checked_shl(8 * (len as u32 + 1))
                    .map_or(u128::MAX, |m| !m);
                sift_field(evs, bytes, at, idx, &mut on, |b| {
                    (u128::from_le_bytes(b) & mask == word) == equal
                });
            }
            // The pattern holds no NUL, so its bytes equal to the raw
            // ones are the name's own.
            Leaf::CommPrefix { at, word, mask } => {
                sift_field(evs, bytes, at, idx, &mut on, |b| {
                    u128::from_le_bytes(b) & mask == word
                });
            }
            Leaf::Cpu(test) => {
                let hit = test.test(u64::from(cpu));
                for k in idx {
                    on(k, hit);
                }
            }
            Leaf::Tree(i) => {
                for k in idx {
                    on(k, trees.get(i).is_some_and(|t| t.test(rec(k), cpu)));
                }
            }
        }
    }
}

/// A program as flat leaves: whether all must hold (else any), and them.
fn flatten(p: Option<Program>, trees: &mut Vec<Node>) -> (bool, Vec<Leaf>) {
    match p.map(|p| p.0) {
        None => (true, Vec::new()),
        Some(Node::All(xs)) => (true, xs.into_iter().map(|x| Leaf::of(x, trees)).collect()),
        Some(Node::Any(xs)) => (false, xs.into_iter().map(|x| Leaf::of(x, trees)).collect()),
        Some(n) => (true, vec![Leaf::of(n, trees)]),
    }
}

/// The names a filter may use beside an event's fields: the CPU the event
/// was recorded on.
const CPU_FIELDS: &[&str] = &["CPU", "cpu", "common_cpu"];

/// Compiles `filter` (of `rule`) against `format`.
pub(crate) fn compile(
    rule: &Rule,
    filter: &Filter,
    format: &EventFormat,
) -> Result<Program, RuleError> {
    node(rule, &filter.expr, format).map(Program)
}

fn node(rule: &Rule, e: &FilterExpr, format: &EventFormat) -> Result<Node, RuleError> {
    Ok(match e {
        FilterExpr::And(a, b) => Node::join(true, node(rule, a, format)?, node(rule, b, format)?),
        FilterExpr::Or(a, b) => Node::join(false, node(rule, a, format)?, node(rule, b, format)?),
        FilterExpr::Not(a) => Node::Not(Box::new(node(rule, a, format)?)),
        FilterExpr::Compare(c) => {
            let event = format!("{}/{}", format.group, format.name);
            let number = |signed: bool| -> Result<i128, RuleError> {
                let v = c.value.text();
                let n = match &c.value {
                    FilterValue::Word(w) => kernel_int(w),
                    FilterValue::Text(t) => kernel_int(t),
                }
                .ok_or_else(|| {
                    rule.error(
                        c.value_span,
                        format!("{v:?} is not a number, and {} is an integer field", c.field),
                        Some("numbers: 11, -1, 0x10, 010 (octal)".into()),
                    )
                })?;
                let fits = if signed {
                    i64::try_from(n).is_ok()
                } else {
                    u64::try_from(n).is_ok()
                };
                if !fits {
                    return Err(rule.error(
                        c.value_span,
                        format!(
                            "{v} does not fit {} ({})",
                            c.field,
                            if signed {
                                "signed"
                            } else {
                                "unsigned: no minus sign"
                            }
                        ),
                        None,
                    ));
                }
                Ok(n)
            };
            let Some(f) = format.field(&c.field) else {
                if CPU_FIELDS.contains(&c.field.as_str()) {
                    check_op(rule, c.op, c.op_span, &c.field, false)?;
                    return Ok(Node::Cpu(IntTest::new(c.op, number(true)?, true)));
                }
                let mut names: Vec<&str> = format
                    .fields
                    .iter()
                    .chain(&format.common)
                    .map(|f| f.name.as_str())
                    .collect();
                names.push("CPU");
                let help = match closest(&c.field, names.iter().copied()) {
                    Some(n) => format!("did you mean {n}? ({event} has {})", names.join(", ")),
                    None => format!("{event} has {}", names.join(", ")),
                };
                let msg = if matches!(c.field.as_str(), "COMM" | "comm") {
                    format!(
                        "{} (the running task's name) is not in the {event} record: the recorder filters on what the record holds",
                        c.field
                    )
                } else {
                    format!("{event} has no field {}", c.field)
                };
                return Err(rule.error(c.field_span, msg, Some(help)));
            };
            match f.kind {
                FieldKind::Int => {
                    check_op(rule, c.op, c.op_span, &c.field, false)?;
                    let at = IntAt::of(f).ok_or_else(|| {
                        rule.error(c.field_span, format!("{} cannot be read", c.field), None)
                    })?;
                    Node::Int {
                        at,
                        test: IntTest::new(c.op, number(f.signed)?, f.signed),
                    }
                }
                FieldKind::CharArray | FieldKind::DataLoc | FieldKind::TailString => {
                    check_op(rule, c.op, c.op_span, &c.field, true)?;
                    let at = TextAt::of(f).ok_or_else(|| {
                        rule.error(c.field_span, format!("{} cannot be read", c.field), None)
                    })?;
                    let pattern = c.value.text().as_bytes();
                    match at {
                        // A name of at most 16 bytes, with no NUL, against
                        // a comm: compared as one word.
                        TextAt::Comm16(off)
                            if c.op != FilterOp::Glob
                                && pattern.len() <= 16
                                && !pattern.contains(&0) =>
                        {
                            let mut b = [0u8; 16];
                            b[..pattern.len()].copy_from_slice(pattern);
                            Node::Comm {
                                at: off,
                                word: u128::from_le_bytes(b),
                                len: pattern.len(),
                                equal: c.op == FilterOp::Eq,
                            }
                        }
                        TextAt::Comm16(off) => match Match::of(c.op, pattern) {
                            // A prefix of a comm: the word's first bytes.
                            Match::Prefix(p) if p.len() <= 16 && !p.contains(&0) => {
                                let mut b = [0u8; 16];
                                b[..p.len()].copy_from_slice(&p);
                                let mut m = [0u8; 16];
                                m[..p.len()].fill(0xff);
                                Node::CommPrefix {
                                    at: off,
                                    word: u128::from_le_bytes(b),
                                    mask: u128::from_le_bytes(m),
                                }
                            }
                            m => Node::Text { at, m },
                        },
                        _ => Node::Text {
                            at,
                            m: Match::of(c.op, pattern),
                        },
                    }
                }
                FieldKind::Opaque => {
                    return Err(rule.error(
                        c.field_span,
                        format!(
                            "{} is {} {} bytes: a filter compares integers and text",
                            c.field,
                            if f.type_name.is_empty() {
                                "a field of"
                            } else {
                                &f.type_name
                            },
                            f.size
                        ),
                        None,
                    ));
                }
            }
        }
    })
}

fn check_op(rule: &Rule, op: FilterOp, at: Span, field: &str, text: bool) -> Result<(), RuleError> {
    if text && !op.for_text() {
        return Err(rule.error(
            at,
            format!("{field} is text: it compares with ==, != or ~ (a glob)"),
            None,
        ));
    }
    if !text && !op.for_int() {
        return Err(rule.error(
            at,
            format!("{field} is an integer: `~` (a glob) is for text"),
            None,
        ));
    }
    Ok(())
}

/// Reads the format of `group/name` from `tracefs`.
fn format_of(
    rule: &Rule,
    tracefs: &Tracefs,
    group: &str,
    name: &str,
    at: Span,
) -> Result<EventFormat, RuleError> {
    let text = tracefs
        .read(&format!("events/{group}/{name}/format"))
        .map_err(|_| {
            let known = tracefs.events_of(group);
            let help = match closest(name, known.iter().map(String::as_str)) {
                Some(c) => format!("did you mean {group}/{c}?"),
                None if known.is_empty() => format!("this kernel has no event group {group}"),
                None => format!("events/{group}/ holds {} events", known.len()),
            };
            rule.error(
                at,
                format!("this kernel has no event {group}/{name}"),
                Some(help),
            )
        })?;
    parse_event_format(group, &text).map_err(|e| {
        rule.error(
            at,
            format!("the kernel's format of {group}/{name} cannot be read: {e}"),
            None,
        )
    })
}

/// Checks a rule's events and filters against the kernel's formats in
/// `tracefs` (the same the recording's instance has).
pub(crate) fn check(rule: &Rule, tracefs: &Tracefs) -> Result<(), RuleError> {
    match &rule.condition {
        Condition::Event { event, filter } => {
            let f = format_of(rule, tracefs, &event.group, &event.name, event.span)?;
            if let Some(filter) = filter {
                compile(rule, filter, &f)?;
            }
        }
        Condition::SchedLatency { filter, .. } => {
            format_of(rule, tracefs, "sched", "sched_switch", rule.condition_span)?;
            let waking = format_of(rule, tracefs, "sched", "sched_waking", rule.condition_span)
                .or_else(|_| {
                    format_of(rule, tracefs, "sched", "sched_wakeup", rule.condition_span)
                })?;
            if let Some(filter) = filter {
                compile(rule, filter, &waking)?;
            }
        }
        Condition::Span {
            begin,
            begin_filter,
            end,
            end_filter,
            key,
            ..
        } => {
            for (e, filter, field) in [
                (begin, begin_filter, &key.begin),
                (end, end_filter, &key.end),
            ] {
                let f = format_of(rule, tracefs, &e.group, &e.name, e.span)?;
                if let Some(filter) = filter {
                    compile(rule, filter, &f)?;
                }
                key_of(rule, &f, field, key.span)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Where a span's key is read.
#[derive(Clone, Copy, Debug)]
enum KeyAt {
    Int(IntAt),
    Text(TextAt),
}

impl KeyAt {
    /// The key of `rec`: the integer, or a hash of the text.
    fn read(self, rec: &[u8]) -> Option<i64> {
        match self {
            KeyAt::Int(at) => at.int(rec),
            KeyAt::Text(at) => at.read(rec).map(|s| {
                // FNV-1a: keys only need to tell a few live spans apart.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for &b in s {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
                h as i64
            }),
        }
    }
}

fn key_of(rule: &Rule, f: &EventFormat, field: &str, at: Span) -> Result<KeyAt, RuleError> {
    let event = format!("{}/{}", f.group, f.name);
    let Some(fd) = f.field(field) else {
        let names: Vec<&str> = f
            .fields
            .iter()
            .chain(&f.common)
            .map(|f| f.name.as_str())
            .collect();
        return Err(rule.error(
            at,
            format!("{event} has no field {field} to pair its events by"),
            Some(match closest(field, names.iter().copied()) {
                Some(n) => format!("did you mean {n}?"),
                None => format!("{event} has {}", names.join(", ")),
            }),
        ));
    };
    IntAt::of(fd)
        .map(KeyAt::Int)
        .or_else(|| TextAt::of(fd).map(KeyAt::Text))
        .ok_or_else(|| rule.error(at, format!("{field} of {event} cannot be a key"), None))
}

/// A span rule's begin or end (its slot).
#[derive(Clone, Copy, Debug)]
enum Hook {
    Begin(u16),
    End(u16),
}

struct EventRule {
    rule: usize,
    /// `common_pid`, for the firing's note.
    pid: Option<IntAt>,
    /// `group/name`, to know whether its freeze was armed.
    event: (String, String),
    limiter: Limiter,
    /// `freeze`: the first match's time, once matched.
    freeze: Option<Option<u64>>,
}

impl EventRule {
    /// Its matches `evs` (in time order) of a walk over `bytes` on `cpu`:
    /// those its limiter admits fire; all are counted once.
    #[inline]
    fn fire<'a>(
        &mut self,
        plan: &RulePlan,
        to_boot: i64,
        bytes: &[u8],
        cpu: u32,
        evs: impl Iterator<Item = &'a Seen>,
    ) {
        let mut matched = 0;
        // Few: the limiter admits at most its rate. Counted before they are
        // queued, so that what takes them never counts more than fired.
        let mut admitted = Vec::new();
        for e in evs {
            if let Some(None) = self.freeze {
                self.freeze = Some(Some(e.ts));
            }
            matched += 1;
            let boot = e.ts.saturating_add_signed(to_boot);
            if self.limiter.admit(boot) {
                admitted.push((boot, e));
            }
        }
        plan.count(self.rule, matched, admitted.len() as u64);
        for (boot, e) in admitted {
            let pid = self.pid.and_then(|p| p.int(e.rec(bytes))).unwrap_or(0);
            plan.fire(self.rule, boot, format!("pid {pid} on cpu {cpu}"));
        }
    }
}

struct SchedRule {
    rule: usize,
    over: u64,
    filter: Option<Program>,
    pid: IntAt,
    next_pid: IntAt,
    limiter: Limiter,
    /// Each thread's wakeup not yet served, or that it is on a CPU.
    woken: Woken,
    /// The thread each CPU last switched to, by CPU.
    on_cpu: Vec<i64>,
    /// Wakeups and switches awaiting their turn.
    held: Held,
}

impl SchedRule {
    /// Keeps a wakeup of `tid` (or a switch to it on `cpu`) at `ts` for
    /// pairing; pairs what is held as it stands when there is no room or
    /// the time does not fit.
    #[inline(always)]
    fn stamp(&mut self, plan: &RulePlan, to_boot: i64, ts: u64, tid: i64, switch: Option<u32>) {
        if !self.held.push(ts, tid, switch) {
            self.settle(plan, to_boot, u64::MAX);
            self.held.push(ts, tid, switch);
        }
    }

    /// Pairs the held stamps older than `cutoff`, in time order: the
    /// wakeups and each CPU's switches merged. A switch on a CPU also ends
    /// the run of the thread that CPU last switched to, so a wakeup of a
    /// thread while it runs (on its way to sleep) is served by that run.
    fn settle(&mut self, plan: &RulePlan, to_boot: i64, cutoff: u64) {
        let nw = self.held.sort_before(cutoff);
        let Held {
            base,
            wakes,
            switches,
            heads,
            ..
        } = &mut self.held;
        let base = *base;
        let wakes = wakes.get(..nw).unwrap_or_default();
        if self.on_cpu.len() < switches.len() {
            self.on_cpu.resize(switches.len(), -1);
        }
        // The earliest switch of any CPU not yet paired, and the earliest
        // of the other CPUs' (until which that CPU's switches come next):
        // a compare per CPU, once per run of one CPU's switches.
        let earliest = |heads: &[(usize, usize)]| {
            let (mut s, mut cpu, mut bound) = (u64::MAX, usize::MAX, u64::MAX);
            for (c, (&(at, end), list)) in heads.iter().zip(switches.iter()).enumerate() {
                if at < end
                    && let Some(&h) = list.get(at)
                {
                    if h < s {
                        (s, cpu, bound) = (h, c, s);
                    } else if h < bound {
                        bound = h;
                    }
                }
            }
            (s, cpu, bound)
        };
        let mut i = 0;
        let (mut s, mut cpu, mut bound) = earliest(heads);
        loop {
            // A wakeup first at the same time (and tid): it led to the switch.
            if let Some(&w) = wakes.get(i)
                && (cpu == usize::MAX || w <= s)
            {
                let (ts, tid) = Held::unpack(base, w);
                self.woken.wake(tid, ts);
                i += 1;
                continue;
            }
            let (Some(head), Some(last)) = (heads.get_mut(cpu), self.on_cpu.get_mut(cpu)) else {
                break;
            };
            head.0 += 1;
            let (ts, tid) = Held::unpack(base, s);
            match switches.get(cpu).and_then(|v| v.get(head.0)) {
                Some(&next) if head.0 < head.1 && next <= bound => s = next,
                _ => (s, cpu, bound) = earliest(heads),
            }
            // The thread it switched from ran since any wakeup it had. The
            // idle task (tid 0), never woken, takes no place among them.
            if *last > 0 && *last != tid {
                self.woken.ran(*last);
            }
            *last = tid;
            let Some(woke) = (tid > 0).then(|| self.woken.run(tid)).flatten() else {
                continue;
            };
            let waited = ts.saturating_sub(woke);
            if waited > self.over {
                let boot = ts.saturating_add_signed(to_boot);
                plan.matched(self.rule, &mut self.limiter, boot, || {
                    format!(
                        "tid {tid} waited {:.3} ms from its wakeup to a CPU",
                        waited as f64 / 1e6
                    )
                });
            }
        }
        self.held.keep_after(nw, cutoff);
    }
}

/// A latency rule's wakeups and switches, each packed into one word:
/// `[ts − base: 42 bits][tid: 22 bits]`. The kernel's tids are below 2^22
/// (its PID_MAX_LIMIT); 42 bits of nanoseconds are 73 minutes. Comparing
/// words compares times, and a drain's worth, 8 bytes an event, stays in
/// cache where 24-byte stamps did not. The wakeups are a few runs already
/// in time order (one per CPU read since the last drain, and what that
/// drain left), so sorting them merges them; each CPU's switches are one
/// run, kept apart so that pairing knows which CPU a switch ended a run on.
struct Held {
    /// What the times are counted from: `SLACK` before the last drain's
    /// cutoff (or the first stamp), so that a CPU read later whose events
    /// are older than another's still fits.
    base: u64,
    wakes: Vec<u64>,
    /// Each CPU's switches, by CPU.
    switches: Vec<Vec<u64>>,
    /// Pairing's place in each CPU's switches, and where those older than
    /// the cutoff end.
    heads: Vec<(usize, usize)>,
    /// Stamps held.
    len: usize,
}

impl Held {
    const SHIFT: u32 = 22;
    const TID_LIMIT: i64 = 1 << Self::SHIFT;
    const MAX_DELTA: u64 = (1 << (64 - Self::SHIFT)) - 1;
    const SLACK: u64 = 1 << 38;

    fn new() -> Self {
        Held {
            base: u64::MAX,
            wakes: Vec::new(),
            switches: Vec::new(),
            heads: Vec::new(),
            len: 0,
        }
    }

    /// Holds a wakeup, or a switch on CPU `switch`. False when it does not
    /// fit: more than 73 minutes after the base, or `MAX_HELD` held (the
    /// held ones must be paired first). A tid the kernel cannot have is
    /// dropped (and so is a wakeup of the idle task, tid 0, which has
    /// none; a switch to it ends a run). A time before the base (which the
    /// drain's order rules out) counts as the base.
    #[inline(always)]
    fn push(&mut self, ts: u64, tid: i64, switch: Option<u32>) -> bool {
        if self.len == 0 {
            self.base = ts.saturating_sub(Self::SLACK);
        }
        let delta = ts.saturating_sub(self.base);
        if delta > Self::MAX_DELTA || self.len >= MAX_HELD {
            return false;
        }
        if (0..Self::TID_LIMIT).contains(&tid) {
            let w = delta << Self::SHIFT | tid as u64;
            match switch {
                Some(cpu) => {
                    let cpu = cpu as usize;
                    if self.switches.len() <= cpu {
                        self.switches.resize_with(cpu + 1, Vec::new);
                    }
                    if let Some(list) = self.switches.get_mut(cpu) {
                        list.push(w);
                        self.len += 1;
                    }
                }
                None if tid != 0 => {
                    self.wakes.push(w);
                    self.len += 1;
                }
                None => {}
            }
        }
        true
    }

    #[inline(always)]
    fn unpack(base: u64, w: u64) -> (u64, i64) {
        (
            base + (w >> Self::SHIFT),
            (w & (Self::TID_LIMIT as u64 - 1)) as i64,
        )
    }

    /// Orders the held stamps and marks, CPU by CPU, the switches older
    /// than `cutoff` (`heads`); how many wakeups are.
    fn sort_before(&mut self, cutoff: u64) -> usize {
        let limit = match cutoff.checked_sub(self.base) {
            Some(d) if d <= Self::MAX_DELTA => d << Self::SHIFT,
            Some(_) => u64::MAX,
            None => 0,
        };
        let before = |v: &mut Vec<u64>| {
            // Stable and run-aware: this merges the runs (a CPU's
            // switches are one already, unless its clock stepped back).
            if !v.is_sorted() {
                v.sort();
            }
            if limit == u64::MAX {
                v.len()
            } else {
                v.partition_point(|&w| w < limit)
            }
        };
        self.heads.clear();
        for list in &mut self.switches {
            let n = before(list);
            self.heads.push((0, n));
        }
        before(&mut self.wakes)
    }

    /// Forgets the first `nw` wakeups and the switches paired, and counts
    /// the rest from `SLACK` before `cutoff`.
    fn keep_after(&mut self, nw: usize, cutoff: u64) {
        self.wakes.drain(..nw.min(self.wakes.len()));
        for (list, &(at, _)) in self.switches.iter_mut().zip(&self.heads) {
            list.drain(..at.min(list.len()));
        }
        self.len = self.wakes.len() + self.switches.iter().map(Vec::len).sum::<usize>();
        let base = cutoff.saturating_sub(Self::SLACK).max(self.base);
        // The rest are newer than the cutoff, so no delta goes below zero.
        let shift = (base - self.base) << Self::SHIFT;
        let low = self
            .switches
            .iter()
            .filter_map(|v| v.first())
            .chain(self.wakes.first())
            .min();
        if shift == 0 || low.is_none_or(|&w| w < shift) {
            return;
        }
        for w in self
            .wakes
            .iter_mut()
            .chain(self.switches.iter_mut().flatten())
        {
            *w -= shift;
        }
        self.base = base;
    }
}

struct SpanRule {
    rule: usize,
    over: u64,
    begin: (Option<Program>, KeyAt),
    end: (Option<Program>, KeyAt),
    limiter: Limiter,
    /// Open spans: key → begin time.
    open: KeyMap,
}

/// An `event` rule's checks on one event: its slot, whether all its
/// leaves must hold (else any) and where they are in `Watch::leaves`.
#[derive(Clone, Copy, Debug)]
struct EventHook {
    slot: u16,
    all: bool,
    leaves: (u32, u32),
}

/// Threads woken and not yet run, direct-mapped by tid: one store to note
/// a wakeup, one compare to find it, no hashing. Two pending threads whose
/// tids share their low 16 bits keep only the later wakeup (a latency of
/// the other is missed): that takes tens of thousands of threads waiting
/// at once.
struct Woken(Vec<(i64, u64)>);

impl Woken {
    const PLACES: usize = 1 << 16;
    /// A place's time when it holds no thread.
    const FREE: u64 = u64::MAX;
    /// A place's time when its thread is on a CPU.
    const RUNNING: u64 = u64::MAX - 1;

    fn new() -> Self {
        Woken(vec![(0, Self::FREE); Self::PLACES])
    }

    #[inline]
    fn place(tid: i64) -> usize {
        tid as usize & (Self::PLACES - 1)
    }

    /// A wakeup of `tid` at `ts`: its first since it last ran counts, and
    /// none while it runs.
    #[inline]
    fn wake(&mut self, tid: i64, ts: u64) {
        if let Some(p) = self.0.get_mut(Self::place(tid))
            && (p.0 != tid || p.1 == Self::FREE)
        {
            *p = (tid, ts);
        }
    }

    /// `tid` is switched in: when it was woken, if it waited.
    #[inline]
    fn run(&mut self, tid: i64) -> Option<u64> {
        let p = self.0.get_mut(Self::place(tid))?;
        let woke = (p.0 == tid && p.1 < Self::RUNNING).then_some(p.1);
        *p = (tid, Self::RUNNING);
        woke
    }

    /// `tid` is switched out: it ran since any wakeup it had.
    #[inline]
    fn ran(&mut self, tid: i64) {
        if let Some(p) = self.0.get_mut(Self::place(tid))
            && p.0 == tid
        {
            p.1 = Self::FREE;
        }
    }
}

/// The hooks of one watched event, by kind, while the rules are compiled.
#[derive(Clone, Debug, Default)]
struct IdHooks {
    checks: Vec<EventHook>,
    waking: Vec<u16>,
    switch: Vec<u16>,
    spans: Vec<Hook>,
}

/// Every watched event's hooks while the rules are compiled; the event
/// table holds each one's index + 1 (`EventEntry::watch`).
#[derive(Default)]
struct Hooks {
    list: Vec<IdHooks>,
    by_id: std::collections::BTreeMap<u16, usize>,
}

impl Hooks {
    /// Event `id`'s hooks, marking it watched in `table` the first time.
    fn of(&mut self, table: &mut EventTable, id: u16) -> &mut IdHooks {
        let n = self.list.len();
        let i = *self.by_id.entry(id).or_insert_with(|| {
            table.set_watch(id, (n + 1) as u16);
            n
        });
        if i == n {
            self.list.push(IdHooks::default());
        }
        &mut self.list[i]
    }
}

/// One thing a watched event does; an event's are one run of
/// `Watch::ops`, so it costs a walk over a few adjacent words.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// A latency rule's switch: `next_pid` stamped, with the CPU.
    Switch { slot: u16, at: IntAt },
    /// A latency rule's wakeup: `pid` stamped, if the rule's filter passes.
    Waking { slot: u16, at: IntAt },
    /// An `event` rule's checks.
    Check(EventHook),
    /// A span's begin or end.
    Span(Hook),
}

/// A watched event of the encoder's walk: its time and where its record is.
#[derive(Clone, Copy, Debug)]
struct Seen {
    ts: u64,
    at: u32,
    len: u32,
}

impl Seen {
    #[inline(always)]
    fn rec(self, bytes: &[u8]) -> &[u8] {
        let at = self.at as usize;
        bytes.get(at..at + self.len as usize).unwrap_or_default()
    }

    /// The `N` bytes at `offset` of its record, if the record holds them.
    #[inline(always)]
    fn field<const N: usize>(self, bytes: &[u8], offset: usize) -> Option<[u8; N]> {
        if offset + N > self.len as usize {
            return None;
        }
        bytes
            .get(self.at as usize + offset..)?
            .first_chunk::<N>()
            .copied()
    }

    /// The integer `at` of its record: a thread id (a signed 32-bit field
    /// in the kernel's formats) read as itself, any other width through
    /// the general read.
    #[inline(always)]
    fn int(self, bytes: &[u8], at: IntAt) -> Option<i64> {
        if (at.size, at.signed) == (4, true) {
            self.field::<4>(bytes, at.offset)
                .map(|b| i64::from(i32::from_le_bytes(b)))
        } else {
            at.int(self.rec(bytes))
        }
    }
}

/// Tells `on`, for each event of `idx`, whether the `N` bytes at `offset`
/// of its record pass `test` (no: the record is shorter): one loop for
/// each width, the width's read in line.
#[inline(always)]
fn sift_field<const N: usize>(
    evs: &[Seen],
    bytes: &[u8],
    offset: usize,
    idx: impl Iterator<Item = u32>,
    on: &mut impl FnMut(u32, bool),
    test: impl Fn([u8; N]) -> bool,
) {
    for k in idx {
        let v = evs
            .get(k as usize)
            .and_then(|e| e.field::<N>(bytes, offset));
        on(k, v.is_some_and(&test));
    }
}

/// A span rule's event, kept for ordering.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    ts: u64,
    key: i64,
    hook: Hook,
}

/// The rules of one ftrace source, compiled against its event table.
pub struct Watch {
    plan: RulePlan,
    /// What each watched event does: one run of `ops` per watched event
    /// (`EventEntry::watch` − 1).
    runs: Vec<(u32, u32)>,
    ops: Vec<Op>,
    /// The watched events of the encoder's current walk, by watched event.
    seen: Vec<Vec<Seen>>,
    /// Scratch of `check`: the events that passed, and those left to test.
    pass: Vec<u32>,
    left: Vec<u32>,
    /// Every `event` rule's comparisons, each rule's in one run.
    leaves: Vec<Leaf>,
    /// What does not fit a leaf (text, nested expressions).
    trees: Vec<Node>,
    events: Vec<EventRule>,
    sched: Vec<SchedRule>,
    spans: Vec<SpanRule>,
    ordered: Vec<Stamp>,
    /// Added to an event's timestamp to make it BOOTTIME (non-zero with the
    /// mono_raw trace clock).
    to_boot: i64,
}

impl Watch {
    /// Compiles the rules of `plan` that watch ftrace against `table`,
    /// marking the events they watch. `None` when none does.
    pub fn new(
        plan: &RulePlan,
        table: &mut EventTable,
        to_boot: i64,
    ) -> Result<Option<Watch>, RuleError> {
        let mut w = Watch {
            plan: plan.clone(),
            runs: Vec::new(),
            ops: Vec::new(),
            seen: Vec::new(),
            pass: Vec::new(),
            left: Vec::new(),
            leaves: Vec::new(),
            trees: Vec::new(),
            events: Vec::new(),
            sched: Vec::new(),
            spans: Vec::new(),
            ordered: Vec::new(),
            to_boot,
        };
        let mut hooks = Hooks::default();
        for (i, rule) in plan.rules.iter().enumerate() {
            let find = |group: &str, name: &str| {
                table
                    .find(group, name)
                    .map(|(id, e)| (id, e.format.clone()))
            };
            let missing = |what: String, at: Span| {
                rule.error(
                    at,
                    format!(
                        "{what} is not recorded (the kernel lacks it, or it could not be enabled)"
                    ),
                    None,
                )
            };
            match &rule.condition {
                Condition::Event { event, filter } => {
                    let (id, format) = find(&event.group, &event.name)
                        .ok_or_else(|| missing(event.path(), event.span))?;
                    let program = filter
                        .as_ref()
                        .map(|f| compile(rule, f, &format))
                        .transpose()?;
                    let slot = w.events.len() as u16;
                    let (all, leaves) = flatten(program, &mut w.trees);
                    let first = w.leaves.len() as u32;
                    w.leaves.extend(leaves);
                    hooks.of(table, id).checks.push(EventHook {
                        slot,
                        all,
                        leaves: (first, w.leaves.len() as u32),
                    });
                    w.events.push(EventRule {
                        rule: i,
                        pid: format.field("common_pid").and_then(IntAt::of),
                        event: (event.group.clone(), event.name.clone()),
                        limiter: Limiter::of(rule),
                        freeze: rule.freeze.map(|_| None),
                    });
                }
                Condition::SchedLatency { over, filter } => {
                    let (switch_id, switch) = find("sched", "sched_switch")
                        .ok_or_else(|| missing("sched/sched_switch".into(), rule.condition_span))?;
                    let (wake_id, wake) = find("sched", "sched_waking")
                        .or_else(|| find("sched", "sched_wakeup"))
                        .ok_or_else(|| missing("sched/sched_waking".into(), rule.condition_span))?;
                    let int = |f: &EventFormat, n: &str| {
                        f.field(n).and_then(IntAt::of).ok_or_else(|| {
                            rule.error(
                                rule.condition_span,
                                format!("{}/{} has no integer {n}", f.group, f.name),
                                None,
                            )
                        })
                    };
                    let slot = w.sched.len() as u16;
                    w.sched.push(SchedRule {
                        rule: i,
                        over: nanos(*over),
                        filter: filter
                            .as_ref()
                            .map(|f| compile(rule, f, &wake))
                            .transpose()?,
                        pid: int(&wake, "pid")?,
                        next_pid: int(&switch, "next_pid")?,
                        limiter: Limiter::of(rule),
                        woken: Woken::new(),
                        on_cpu: Vec::new(),
                        held: Held::new(),
                    });
                    hooks.of(table, wake_id).waking.push(slot);
                    hooks.of(table, switch_id).switch.push(slot);
                }
                Condition::Span {
                    begin,
                    begin_filter,
                    end,
                    end_filter,
                    key,
                    over,
                } => {
                    let (bid, bf) = find(&begin.group, &begin.name)
                        .ok_or_else(|| missing(begin.path(), begin.span))?;
                    let (eid, ef) =
                        find(&end.group, &end.name).ok_or_else(|| missing(end.path(), end.span))?;
                    let slot = w.spans.len() as u16;
                    w.spans.push(SpanRule {
                        rule: i,
                        over: nanos(*over),
                        begin: (
                            begin_filter
                                .as_ref()
                                .map(|f| compile(rule, f, &bf))
                                .transpose()?,
                            key_of(rule, &bf, &key.begin, key.span)?,
                        ),
                        end: (
                            end_filter
                                .as_ref()
                                .map(|f| compile(rule, f, &ef))
                                .transpose()?,
                            key_of(rule, &ef, &key.end, key.span)?,
                        ),
                        limiter: Limiter::of(rule),
                        open: KeyMap::default(),
                    });
                    hooks.of(table, bid).spans.push(Hook::Begin(slot));
                    hooks.of(table, eid).spans.push(Hook::End(slot));
                }
                _ => {}
            }
        }
        for h in hooks.list {
            let start = w.ops.len() as u32;
            for &slot in &h.switch {
                if let Some(r) = w.sched.get(usize::from(slot)) {
                    w.ops.push(Op::Switch {
                        slot,
                        at: r.next_pid,
                    });
                }
            }
            for &slot in &h.waking {
                if let Some(r) = w.sched.get(usize::from(slot)) {
                    w.ops.push(Op::Waking { slot, at: r.pid });
                }
            }
            w.ops.extend(h.checks.iter().map(|&hk| Op::Check(hk)));
            w.ops.extend(h.spans.iter().map(|&hk| Op::Span(hk)));
            w.runs.push((start, w.ops.len() as u32));
            w.seen.push(Vec::new());
        }
        let watches = !(w.events.is_empty() && w.sched.is_empty() && w.spans.is_empty());
        Ok(watches.then_some(w))
    }

    /// Events that `freeze` rules stop the kernel at, with their filters:
    /// `(group, name, filter)`.
    pub(crate) fn freezes(plan: &RulePlan) -> Vec<(String, String, Option<String>)> {
        plan.rules
            .iter()
            .filter(|r| r.freeze.is_some())
            .filter_map(|r| match &r.condition {
                Condition::Event { event, filter } => Some((
                    event.group.clone(),
                    event.name.clone(),
                    filter.as_ref().map(|f| r.filter_text(f).to_string()),
                )),
                _ => None,
            })
            .collect()
    }

    /// Now on the trace clock: where a drain starting now cuts.
    pub fn now(&self) -> u64 {
        crate::clock::boottime_ns().saturating_add_signed(-self.to_boot)
    }

    fn boot(&self, ts: u64) -> u64 {
        ts.saturating_add_signed(self.to_boot)
    }

    /// A watched event of the encoder's walk over `bytes` (`watch`: its
    /// entry's `EventEntry::watch`): its record is `len` bytes at `at`.
    /// Kept until the walk ends ([`Self::on_walk`]).
    #[inline(always)]
    pub(crate) fn saw(&mut self, watch: u16, ts: u64, at: usize, len: usize) {
        if let Some(v) = self.seen.get_mut(usize::from(watch).wrapping_sub(1)) {
            v.push(Seen {
                ts,
                at: at as u32,
                len: len as u32,
            });
        }
    }

    /// The end of a walk over `bytes`, on `cpu`: the rules run over the
    /// events it saw, one rule's check at a time over all the events it
    /// watches (what a check costs is then its loads and compares, not a
    /// dispatch per event).
    #[inline(never)]
    pub(crate) fn on_walk(&mut self, bytes: &[u8], cpu: u32) {
        for i in 0..self.seen.len() {
            let Some(evs) = self.seen.get_mut(i).filter(|v| !v.is_empty()) else {
                continue;
            };
            let evs = std::mem::take(evs);
            self.columns(i, bytes, cpu, &evs);
            if let Some(v) = self.seen.get_mut(i) {
                *v = evs;
                v.clear();
            }
        }
    }

    /// One watched event (`watch`: its entry's `EventEntry::watch`), at `ts`,
    /// recorded on `cpu`: what the encoder's general path shows the rules.
    #[inline(never)]
    pub(crate) fn on_event(&mut self, watch: u16, cpu: u32, ts: u64, rec: &[u8]) {
        let one = [Seen {
            ts,
            at: 0,
            len: rec.len() as u32,
        }];
        self.columns(usize::from(watch).wrapping_sub(1), rec, cpu, &one);
    }

    /// The hooks of watched event `i` over its events `evs` (records in
    /// `bytes`), each hook over all of them in turn.
    fn columns(&mut self, i: usize, bytes: &[u8], cpu: u32, evs: &[Seen]) {
        let Some(&(a, b)) = self.runs.get(i) else {
            return;
        };
        for k in a as usize..b as usize {
            let Some(&op) = self.ops.get(k) else {
                break;
            };
            let Watch {
                sched,
                spans,
                ordered,
                plan,
                to_boot,
                ..
            } = self;
            match op {
                Op::Switch { slot, at } => {
                    let Some(r) = sched.get_mut(usize::from(slot)) else {
                        continue;
                    };
                    for e in evs {
                        if let Some(tid) = e.int(bytes, at) {
                            r.stamp(plan, *to_boot, e.ts, tid, Some(cpu));
                        }
                    }
                }
                Op::Waking { slot, at } => {
                    let Some(r) = sched.get_mut(usize::from(slot)) else {
                        continue;
                    };
                    for e in evs {
                        if let Some(tid) = e.int(bytes, at)
                            && r.filter.as_ref().is_none_or(|p| p.eval(e.rec(bytes), cpu))
                        {
                            r.stamp(plan, *to_boot, e.ts, tid, None);
                        }
                    }
                }
                Op::Check(hk) => self.check(hk, bytes, cpu, evs),
                Op::Span(hook) => {
                    let (Hook::Begin(s) | Hook::End(s)) = hook;
                    let Some(r) = spans.get(usize::from(s)) else {
                        continue;
                    };
                    let (filter, key) = if matches!(hook, Hook::Begin(_)) {
                        &r.begin
                    } else {
                        &r.end
                    };
                    for e in evs {
                        let rec = e.rec(bytes);
                        if filter.as_ref().is_none_or(|p| p.eval(rec, cpu))
                            && let Some(key) = key.read(rec)
                        {
                            ordered.push(Stamp {
                                ts: e.ts,
                                key,
                                hook,
                            });
                        }
                    }
                }
            }
        }
        if self.ordered.len() >= MAX_ORDERED {
            // Pair what is held as it stands rather than grow without bound.
            self.settle(u64::MAX);
        }
    }

    /// An `event` rule's check over `evs`: an `&&` chain leaf by leaf, each
    /// over the events the ones before passed (most rules' first leaf
    /// passes none); an `||` chain each leaf over them all, the events any
    /// passed merged. The matches fire in time order.
    fn check(&mut self, hk: EventHook, bytes: &[u8], cpu: u32, evs: &[Seen]) {
        let Watch {
            leaves,
            trees,
            events,
            plan,
            to_boot,
            pass,
            left,
            ..
        } = self;
        let leaves = leaves
            .get(hk.leaves.0 as usize..hk.leaves.1 as usize)
            .unwrap_or_default();
        let Some(r) = events.get_mut(usize::from(hk.slot)) else {
            return;
        };
        let all = 0..evs.len() as u32;
        pass.clear();
        match leaves.split_first() {
            // No filter: every event matches.
            None => return r.fire(plan, *to_boot, bytes, cpu, evs.iter()),
            Some((first, rest)) if hk.all => {
                first.sift(trees, bytes, cpu, evs, all, |k, p| {
                    if p {
                        pass.push(k)
                    }
                });
                for leaf in rest {
                    if pass.is_empty() {
                        break;
                    }
                    std::mem::swap(pass, left);
                    pass.clear();
                    leaf.sift(trees, bytes, cpu, evs, left.iter().copied(), |k, p| {
                        if p {
                            pass.push(k)
                        }
                    });
                }
            }
            // Each comparison over every event, what passes gathered: with
            // the usual comparison that most events fail there is nothing
            // to narrow, and a list of what failed would cost more than
            // the tests it saves.
            Some(_) => {
                for leaf in leaves {
                    leaf.sift(trees, bytes, cpu, evs, all.clone(), |k, p| {
                        if p {
                            pass.push(k)
                        }
                    });
                }
                pass.sort_unstable();
                pass.dedup();
            }
        }
        r.fire(
            plan,
            *to_boot,
            bytes,
            cpu,
            pass.iter().filter_map(|&k| evs.get(k as usize)),
        );
    }

    /// The end of a drain that began at `cutoff` (trace clock; `u64::MAX`
    /// for the last): pairs the latency events older than it, in time
    /// order.
    pub fn settle(&mut self, cutoff: u64) {
        for r in &mut self.sched {
            r.settle(&self.plan, self.to_boot, cutoff);
        }
        if self.ordered.is_empty() {
            return;
        }
        // Stable: each CPU's run is in order already, so this merges runs.
        self.ordered.sort_by_key(|s| s.ts);
        let n = self.ordered.partition_point(|s| s.ts < cutoff);
        let mut held = std::mem::take(&mut self.ordered);
        for s in held.drain(..n) {
            self.pair(s);
        }
        self.ordered = held;
    }

    fn pair(&mut self, s: Stamp) {
        let boot = self.boot(s.ts);
        match s.hook {
            Hook::Begin(i) => {
                let r = &mut self.spans[usize::from(i)];
                if r.open.len() >= MAX_PENDING {
                    forget_older_half(&mut r.open);
                }
                r.open.insert(s.key, s.ts);
            }
            Hook::End(i) => {
                let r = &mut self.spans[usize::from(i)];
                if let Some(b) = r.open.remove(&s.key) {
                    let took = s.ts.saturating_sub(b);
                    if took > r.over {
                        self.plan.matched(r.rule, &mut r.limiter, boot, || {
                            format!("a span of {:.3} ms", took as f64 / 1e6)
                        });
                    }
                }
            }
        }
    }

    /// After the last drain: for each `freeze` rule whose trigger the kernel
    /// took (`armed`: its events) and that matched, how long after its
    /// match the last event of any CPU was (`last_ts`, trace clock), in the
    /// rule's tally.
    pub(crate) fn note_freeze(&self, last_ts: u64, armed: &[(String, String)]) {
        for r in &self.events {
            if let Some(Some(at)) = r.freeze
                && armed.contains(&r.event)
                && let Some(t) = self.plan.tallies.get(r.rule)
            {
                let after = last_ts.saturating_sub(at);
                t.frozen_after_ns
                    .store(after, std::sync::atomic::Ordering::Relaxed);
                log::info!(
                    "freeze: the kernel's buffers hold events up to {:.1} µs after the match of rule {:?}",
                    after as f64 / 1e3,
                    self.plan.rules.get(r.rule).map_or("", |r| r.name.as_str())
                );
            }
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Forgets the older half of `map` (by its time values).
fn forget_older_half(map: &mut KeyMap) {
    let mut times: Vec<u64> = map.values().copied().collect();
    let mid = times.len() / 2;
    let (_, median, _) = times.select_nth_unstable(mid);
    let median = *median;
    map.retain(|_, t| *t >= median);
}

#[cfg(test)]
mod tests;

//! A rule's filter compiled against its event's format: a [`Program`] over
//! the raw record, in the kernel's filter grammar, and its comparisons
//! flattened into [`Leaf`]s that test a walk's events one comparison at a
//! time.

use super::Seen;
use crate::config::diagnostic::closest;
use crate::config::rule::filter::{glob_match, kernel_int};
use crate::config::rule::{Filter, FilterExpr, FilterOp, FilterValue, Rule, RuleError, Span};
use crate::sources::ftrace::event_table::{IntAt, TextAt, comm16};
use crate::sources::ftrace::format::{EventFormat, FieldKind};

/// A compiled filter.
#[derive(Clone, Debug)]
pub(crate) struct Program(Node);

#[derive(Clone, Debug)]
pub(super) enum Node {
    /// Every one (an `&&` chain).
    All(Vec<Node>),
    /// Any one (an `||` chain).
    Any(Vec<Node>),
    Not(Box<Node>),
    Compare(Comparison),
    Text {
        at: TextAt,
        m: Match,
    },
}

/// A comparison of fixed size: what a flattened filter's [`Leaf`] holds in
/// line, as a tree's [`Node`] does.
#[derive(Clone, Copy, Debug)]
pub(super) enum Comparison {
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
}

impl Comparison {
    #[inline(always)]
    fn test(self, rec: &[u8], cpu: u32) -> bool {
        match self {
            Comparison::Int { at, test } => at.int(rec).is_some_and(|v| test.test(v as u64)),
            Comparison::Comm {
                at,
                word,
                len,
                equal,
            } => comm16(rec, at).is_some_and(|(w, n)| (w == word && n == len) == equal),
            Comparison::CommPrefix { at, word, mask } => {
                comm16(rec, at).is_some_and(|(w, _)| w & mask == word)
            }
            Comparison::Cpu(test) => test.test(u64::from(cpu)),
        }
    }
}

/// Every integer comparison as one test without branches on the operator:
/// the value, its sign bit flipped for signed fields (so that unsigned
/// order is signed order) and masked for `&`, lies in `[lo, lo + span]`,
/// or (`negate`) does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct IntTest {
    bias: u64,
    mask: u64,
    lo: u64,
    span: u64,
    negate: bool,
}

impl IntTest {
    /// `field OP value` for a field read as `raw` (sign-extended when
    /// `signed`); `value` fits the field's signedness.
    pub(super) fn new(op: FilterOp, value: i128, signed: bool) -> IntTest {
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
    pub(super) fn test(self, raw: u64) -> bool {
        (((raw ^ self.bias) & self.mask).wrapping_sub(self.lo) <= self.span) != self.negate
    }
}

/// How text is matched, the glob's common shapes taken apart once.
#[derive(Clone, Debug)]
pub(super) enum Match {
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
            Node::Compare(c) => c.test(rec, cpu),
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
pub(super) enum Leaf {
    Compare(Comparison),
    /// Text or a nested expression: the tree of this index.
    Tree(usize),
}

impl Leaf {
    fn of(n: Node, trees: &mut Vec<Node>) -> Leaf {
        match n {
            Node::Compare(c) => Leaf::Compare(c),
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
    pub(super) fn sift(
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
            Leaf::Compare(Comparison::Int { at, test }) => match (at.size, at.signed) {
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
            Leaf::Compare(Comparison::Comm {
                at,
                word,
                len,
                equal,
            }) => {
                let mask = u128::MAX
                    .checked_shl(8 * (len as u32 + 1))
                    .map_or(u128::MAX, |m| !m);
                sift_field(evs, bytes, at, idx, &mut on, |b| {
                    (u128::from_le_bytes(b) & mask == word) == equal
                });
            }
            // The pattern holds no NUL, so its bytes equal to the raw
            // ones are the name's own.
            Leaf::Compare(Comparison::CommPrefix { at, word, mask }) => {
                sift_field(evs, bytes, at, idx, &mut on, |b| {
                    u128::from_le_bytes(b) & mask == word
                });
            }
            Leaf::Compare(Comparison::Cpu(test)) => {
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
pub(super) fn flatten(p: Option<Program>, trees: &mut Vec<Node>) -> (bool, Vec<Leaf>) {
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
                    return Ok(Node::Compare(Comparison::Cpu(IntTest::new(
                        c.op,
                        number(true)?,
                        true,
                    ))));
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
                    Node::Compare(Comparison::Int {
                        at,
                        test: IntTest::new(c.op, number(f.signed)?, f.signed),
                    })
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
                            Node::Compare(Comparison::Comm {
                                at: off,
                                word: u128::from_le_bytes(b),
                                len: pattern.len(),
                                equal: c.op == FilterOp::Eq,
                            })
                        }
                        TextAt::Comm16(off) => match Match::of(c.op, pattern) {
                            // A prefix of a comm: the word's first bytes.
                            Match::Prefix(p) if p.len() <= 16 && !p.contains(&0) => {
                                let mut b = [0u8; 16];
                                b[..p.len()].copy_from_slice(&p);
                                let mut m = [0u8; 16];
                                m[..p.len()].fill(0xff);
                                Node::Compare(Comparison::CommPrefix {
                                    at: off,
                                    word: u128::from_le_bytes(b),
                                    mask: u128::from_le_bytes(m),
                                })
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

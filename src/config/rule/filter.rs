//! The kernel's event filter grammar (Documentation/trace/events.rst,
//! "Event filtering"), as rules take it after `if`:
//!
//! ```text
//!  filter := and ('||' and)*
//!  and    := unary ('&&' unary)*
//!  unary  := '!' unary | '(' filter ')' | FIELD OP VALUE
//!  OP     := '==' | '!=' | '<' | '<=' | '>' | '>=' | '&' | '~'
//! ```
//!
//! Integers compare with `==` … `>=` and test bits with `&` (true when any
//! is set); text compares with `==`, `!=` and `~` (a glob: `*`, `?`,
//! `[…]`). A value is a number as the kernel reads one (`11`, `-1`,
//! `0x10`, `010` octal) or text, quoted or not. The same text is what
//! `freeze` gives the kernel, so both sides filter alike.

use super::Span;

/// Nesting of `(` and `!` at most.
pub(crate) const MAX_DEPTH: usize = 32;
/// Comparisons in one filter at most.
pub(crate) const MAX_COMPARES: usize = 64;

/// A filter and where it is in its rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    /// The parsed expression.
    pub expr: FilterExpr,
    pub(crate) span: Span,
}

/// A filter's expression tree.
#[derive(Clone, Debug, PartialEq)]
pub enum FilterExpr {
    /// `a && b`: both hold.
    And(Box<FilterExpr>, Box<FilterExpr>),
    /// `a || b`: either holds.
    Or(Box<FilterExpr>, Box<FilterExpr>),
    /// `!a`: `a` does not hold.
    Not(Box<FilterExpr>),
    /// A leaf: one field compared with a value.
    Compare(Box<Compare>),
}

impl FilterExpr {
    /// Every comparison, left to right.
    #[cfg(test)]
    pub(crate) fn compares(&self) -> Vec<&Compare> {
        let mut out = Vec::new();
        self.walk(&mut out);
        out
    }

    #[cfg(test)]
    fn walk<'a>(&'a self, out: &mut Vec<&'a Compare>) {
        match self {
            FilterExpr::And(a, b) | FilterExpr::Or(a, b) => {
                a.walk(out);
                b.walk(out);
            }
            FilterExpr::Not(a) => a.walk(out),
            FilterExpr::Compare(c) => out.push(c),
        }
    }
}

/// `FIELD OP VALUE`.
#[derive(Clone, Debug, PartialEq)]
pub struct Compare {
    /// A field of the event, as its tracefs `format` names it.
    pub field: String,
    pub(crate) field_span: Span,
    /// How the field is compared.
    pub op: FilterOp,
    pub(crate) op_span: Span,
    /// What it is compared with.
    pub value: FilterValue,
    pub(crate) value_span: Span,
}

/// A comparison's operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterOp {
    /// `==`: equal (integers or text).
    Eq,
    /// `!=`: not equal (integers or text).
    Ne,
    /// `<` (integers only).
    Lt,
    /// `<=` (integers only).
    Le,
    /// `>` (integers only).
    Gt,
    /// `>=` (integers only).
    Ge,
    /// `&`: any of the value's bits set.
    BitAnd,
    /// `~`: a glob.
    Glob,
}

impl FilterOp {
    pub(crate) fn from_op(op: &str) -> Option<Self> {
        Some(match op {
            "==" => FilterOp::Eq,
            "!=" => FilterOp::Ne,
            "<" => FilterOp::Lt,
            "<=" => FilterOp::Le,
            ">" => FilterOp::Gt,
            ">=" => FilterOp::Ge,
            "&" => FilterOp::BitAnd,
            "~" => FilterOp::Glob,
            _ => return None,
        })
    }

    /// Whether text fields take it.
    pub(crate) fn for_text(self) -> bool {
        matches!(self, FilterOp::Eq | FilterOp::Ne | FilterOp::Glob)
    }

    /// Whether integer fields take it.
    pub(crate) fn for_int(self) -> bool {
        self != FilterOp::Glob
    }
}

/// A comparison's value as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterValue {
    /// Quoted.
    Text(String),
    /// Unquoted: a number, or text.
    Word(String),
}

impl FilterValue {
    /// The value's text, without quotes.
    pub fn text(&self) -> &str {
        match self {
            FilterValue::Text(s) | FilterValue::Word(s) => s,
        }
    }
}

/// A number as the kernel reads one (`kstrtoll` with base 0): decimal,
/// `0x` hex, a leading `0` octal, an optional sign. `None` when it is not.
pub(crate) fn kernel_int(s: &str) -> Option<i128> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (radix, digits) = crate::config::text::radix_and_digits(body);
    if digits.is_empty() || digits.len() > 24 {
        return None;
    }
    let v = i128::from_str_radix(digits, radix).ok()?;
    Some(if neg { -v } else { v })
}

/// Whether `text` matches the glob `pattern` (`*` any run, `?` one byte,
/// `[abc]`/`[a-z]`/`[!a]` a class), byte by byte as the kernel's
/// `glob_match`.
pub(crate) fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where to resume after the last `*`: its pattern position and the
    // text position it has eaten up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        let step = match pattern.get(p) {
            Some(b'*') => {
                star = Some((p + 1, t));
                p += 1;
                continue;
            }
            Some(b'?') => Some(p + 1),
            Some(b'[') => match class(pattern, p, text[t]) {
                Some(end) => end,
                // An unclosed `[` is a plain character.
                None => (text[t] == b'[').then_some(p + 1),
            },
            Some(&c) if c == text[t] => Some(p + 1),
            _ => None,
        };
        match step {
            Some(next) => {
                p = next;
                t += 1;
            }
            None => match star {
                Some((sp, st)) => {
                    p = sp;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class starting at `pattern[at]` (`[`): the
/// position after the class when it matches, `Some(None)` when it does
/// not, `None` when the class is not closed.
fn class(pattern: &[u8], at: usize, c: u8) -> Option<Option<usize>> {
    let mut i = at + 1;
    let negate = matches!(pattern.get(i), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let &a = pattern.get(i)?;
        if a == b']' && !first {
            break;
        }
        first = false;
        if pattern.get(i + 1) == Some(&b'-') && pattern.get(i + 2).is_some_and(|&b| b != b']') {
            let b = pattern[i + 2];
            hit |= a <= c && c <= b;
            i += 3;
        } else {
            hit |= a == c;
            i += 1;
        }
    }
    Some((hit != negate).then_some(i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_as_the_kernel_reads_them() {
        assert_eq!(kernel_int("11"), Some(11));
        assert_eq!(kernel_int("-1"), Some(-1));
        assert_eq!(kernel_int("0x1F"), Some(31));
        assert_eq!(kernel_int("010"), Some(8));
        assert_eq!(kernel_int("0"), Some(0));
        assert_eq!(kernel_int("abc"), None);
        assert_eq!(kernel_int("08"), None);
        assert_eq!(kernel_int("18446744073709551615"), Some(u64::MAX as i128));
    }

    #[test]
    fn globs() {
        for (p, t, want) in [
            ("*", "", true),
            ("my*", "myapp", true),
            ("*app", "myapp", true),
            ("*pa*", "myapp", false),
            ("*ap*", "myapp", true),
            ("m?app", "myapp", true),
            ("[lm]yapp", "myapp", true),
            ("[!m]yapp", "myapp", false),
            ("[a-z]y*", "myapp", true),
            ("B|*|iter*", "B|1234|iteration 5\n", true),
            ("E|*|iter*", "B|1234|iteration 5\n", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("[", "[", true),
        ] {
            assert_eq!(glob_match(p.as_bytes(), t.as_bytes()), want, "{p} ~ {t}");
        }
    }
}

//! The tokens of a rule line, with their byte offsets into the rule's
//! source (so an error points at its token): words, quoted strings and the
//! operators of the rule and filter grammars.

use super::{RuleError, RuleSource, Span};

/// What a token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    /// A run of characters that are neither blank, quotes nor operators:
    /// names, events (`sched/sched_switch`), numbers with units (`50ms`).
    Word,
    /// A quoted string, its quotes removed.
    Str(String),
    /// An operator or punctuation: `: == != <= >= && || < > & ~ ! ( ) =`.
    Op(&'static str),
}

/// One token and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Token {
    pub(crate) tok: Tok,
    pub(crate) span: Span,
}

/// Operators, longest first so `<=` is not read as `<` then `=`.
const OPS: &[&str] = &[
    "==", "!=", "<=", ">=", "&&", "||", ":", "<", ">", "&", "~", "!", "(", ")", "=",
];

/// Whether `c` ends a word.
fn ends_word(c: char) -> bool {
    c.is_whitespace()
        || c.is_control()
        || matches!(
            c,
            '"' | '\'' | ':' | '=' | '!' | '<' | '>' | '&' | '|' | '~' | '(' | ')'
        )
}

/// The tokens of `src.text[span]`. Control characters and bytes outside
/// printable ASCII (but in quoted strings) are refused at the byte.
pub(super) fn tokens(src: &RuleSource, span: Span) -> Result<Vec<Token>, RuleError> {
    let text = &src.text;
    let end = span.start + span.len;
    let mut out = Vec::new();
    let mut i = span.start;
    while i < end {
        let rest = &text[i..end];
        let Some(c) = rest.chars().next() else { break };
        if c == ' ' || c == '\t' {
            i += 1;
            continue;
        }
        if c.is_control() {
            return Err(src.error(
                Span::new(i, c.len_utf8()),
                format!(
                    "the control character U+{:04X} cannot appear in a rule",
                    c as u32
                ),
                None,
            ));
        }
        if c == '"' || c == '\'' {
            let body = &rest[1..];
            let Some(close) = body.find(c) else {
                return Err(src.error(
                    Span::new(i, rest.len()),
                    "this string has no closing quote",
                    Some(format!("end it with {c}")),
                ));
            };
            let s = &body[..close];
            if let Some((at, bad)) = s.char_indices().find(|(_, ch)| ch.is_control()) {
                return Err(src.error(
                    Span::new(i + 1 + at, bad.len_utf8()),
                    format!(
                        "the control character U+{:04X} cannot appear in a rule",
                        bad as u32
                    ),
                    None,
                ));
            }
            out.push(Token {
                tok: Tok::Str(s.to_string()),
                span: Span::new(i, close + 2),
            });
            i += close + 2;
            continue;
        }
        if let Some(op) = OPS.iter().find(|op| rest.starts_with(**op)) {
            out.push(Token {
                tok: Tok::Op(op),
                span: Span::new(i, op.len()),
            });
            i += op.len();
            continue;
        }
        if c == '|' {
            return Err(src.error(
                Span::new(i, 1),
                "a single `|` is not an operator",
                Some("`||` joins two conditions; `&` tests bits".into()),
            ));
        }
        let len = rest.find(ends_word).unwrap_or(rest.len());
        let word = &rest[..len];
        if let Some((at, bad)) = word.char_indices().find(|(_, ch)| !ch.is_ascii_graphic()) {
            return Err(src.error(
                Span::new(i + at, bad.len_utf8()),
                format!(
                    "{:?} is not printable ASCII: outside quotes a rule is written in ASCII",
                    bad
                ),
                None,
            ));
        }
        out.push(Token {
            tok: Tok::Word,
            span: Span::new(i, len),
        });
        i += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Vec<String> {
        let src = RuleSource::new("t", text);
        tokens(&src, Span::new(0, text.len()))
            .expect("lexes")
            .into_iter()
            .map(|t| match t.tok {
                Tok::Word => format!("w:{}", src.slice(t.span)),
                Tok::Str(s) => format!("s:{s}"),
                Tok::Op(o) => format!("o:{o}"),
            })
            .collect()
    }

    #[test]
    fn words_operators_and_strings() {
        assert_eq!(
            kinds(r#"x: event sched/sched_switch if prev_state&2 && comm=="a b""#),
            [
                "w:x",
                "o::",
                "w:event",
                "w:sched/sched_switch",
                "w:if",
                "w:prev_state",
                "o:&",
                "w:2",
                "o:&&",
                "w:comm",
                "o:==",
                "s:a b"
            ]
        );
        assert_eq!(
            kinds("a<=-5 b>=0x10"),
            ["w:a", "o:<=", "w:-5", "w:b", "o:>=", "w:0x10"]
        );
    }

    #[test]
    fn unprintable_bytes_are_refused_where_they_are() {
        let src = RuleSource::new("t", "x: loss\x1b[2J");
        let e = tokens(&src, Span::new(0, src.text.len())).expect_err("refused");
        let r = e.to_string();
        assert!(
            r.contains("t:1:8: error: the control character U+001B"),
            "{r}"
        );
        assert!(!r.contains('\x1b'), "{r:?}");
        let src = RuleSource::new("t", "x: event sched/é");
        assert!(tokens(&src, Span::new(0, src.text.len())).is_err());
        let src = RuleSource::new("t", "x: event a/b if comm == \"é\"");
        assert!(tokens(&src, Span::new(0, src.text.len())).is_ok());
    }
}

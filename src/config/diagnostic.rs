//! Positioned errors in config text, rendered the way compilers do:
//! `FILE:LINE:COL: error: MESSAGE`, the offending line, a caret under the token,
//! and a suggestion where one exists.

use std::fmt;

/// An error at a place in a text config. Positions are byte offsets into the
/// source; line and column (1-based, column in characters) are derived when the
/// error is rendered against its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextError {
    /// Byte offset of the offending token.
    pub offset: usize,
    /// Byte length of the offending token (at least 1 is drawn).
    pub len: usize,
    /// What is wrong.
    pub message: String,
    /// A hint: a close spelling, or the valid names.
    pub help: Option<String>,
}

impl TextError {
    pub(crate) fn new(offset: usize, len: usize, message: impl Into<String>) -> Self {
        TextError {
            offset,
            len,
            message: message.into(),
            help: None,
        }
    }

    pub(crate) fn with_help(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    /// 1-based line and column (in characters) of the error in `src`.
    pub(crate) fn line_col(&self, src: &str) -> (usize, usize) {
        let at = self.offset.min(src.len());
        let before = &src[..floor_char_boundary(src, at)];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }

    /// Renders the full diagnostic against the source it came from. The
    /// source is untrusted and goes to a terminal: control characters are
    /// shown escaped (`\u{1b}`), and a long line, message or note is cut
    /// to a window around the error, so the whole stays a few hundred bytes.
    pub fn render(&self, origin: &str, src: &str) -> String {
        let (line, col) = self.line_col(src);
        let at = floor_char_boundary(src, self.offset.min(src.len()));
        let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
        let line_end = src[at..].find('\n').map_or(src.len(), |i| at + i);
        let before: Vec<char> = src[line_start..at].chars().collect();
        let after: Vec<char> = src[at..line_end].trim_end_matches('\r').chars().collect();
        let shown_before = &before[before.len().saturating_sub(WINDOW)..];
        let shown_after = &after[..after.len().min(WINDOW)];
        let mut text = String::new();
        let mut pad = String::new();
        if shown_before.len() < before.len() {
            text.push('…');
            pad.push(' ');
        }
        for &c in shown_before {
            let shown = visible_char(c);
            // Keep tabs so the caret lines up under the token.
            pad.extend(shown.chars().map(|s| if s == '\t' { '\t' } else { ' ' }));
            text.push_str(&shown);
        }
        let token_end = floor_char_boundary(src, (at + self.len).min(line_end));
        let token_chars = src[at..token_end].chars().count().min(shown_after.len());
        let mut width = 0;
        for (i, &c) in shown_after.iter().enumerate() {
            let shown = visible_char(c);
            if i < token_chars {
                width += shown.chars().count();
            }
            text.push_str(&shown);
        }
        if shown_after.len() < after.len() {
            text.push('…');
        }
        let mut out = format!(
            "{}:{line}:{col}: error: {}\n{text}\n{pad}^",
            visible(origin, MAX_MESSAGE_CHARS),
            visible(&self.message, MAX_MESSAGE_CHARS)
        );
        out.push_str(&"~".repeat(width.max(1) - 1));
        if let Some(h) = &self.help {
            out.push_str("\nnote: ");
            out.push_str(&visible(h, MAX_MESSAGE_CHARS));
        }
        out
    }
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.message)?;
        if let Some(h) = &self.help {
            write!(f, " ({h})")?;
        }
        Ok(())
    }
}

/// Characters of the offending line shown on each side of the error.
const WINDOW: usize = 80;
/// Characters of a message or note shown at most.
const MAX_MESSAGE_CHARS: usize = 400;

/// `c` as shown on a terminal: itself, or escaped when it is a control
/// character (tab excepted) or a bidirectional override.
fn visible_char(c: char) -> String {
    let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if c == '\t' || !(c.is_control() || bidi) {
        c.to_string()
    } else {
        c.escape_unicode().to_string()
    }
}

/// Multi-line text for a terminal: control characters escaped except
/// newlines and tabs.
pub(crate) fn terminal_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c == '\n' {
                "\n".to_string()
            } else {
                visible_char(c)
            }
        })
        .collect()
}

/// `s` with control characters escaped, cut to `max` characters.
pub(crate) fn visible(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push_str(&format!("… ({} bytes in all)", s.len()));
            break;
        }
        out.push_str(&visible_char(c));
    }
    out
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Edit distance counting a swap of two neighbours as one edit (optimal
/// string alignment), for "did you mean" suggestions.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows: two back (for swaps), the previous one, the current one.
    let mut back: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 0..a.len() {
        cur[0] = i + 1;
        for j in 0..b.len() {
            let sub = prev[j] + usize::from(a[i] != b[j]);
            let mut d = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
            if i > 0 && j > 0 && a[i] == b[j - 1] && a[i - 1] == b[j] {
                d = d.min(back[j - 1] + 1);
            }
            cur[j + 1] = d;
        }
        std::mem::swap(&mut back, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate closest to `word`, if it is close enough to be a likely typo
/// (at most a third of the word's length, and at least 1 edit allowed).
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let chars = word.chars().count();
    // No name is that long: a huge token gets no suggestion, and costs no
    // quadratic comparisons.
    if chars > 128 {
        return None;
    }
    let limit = (chars / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| c.len().abs_diff(word.len()) <= limit)
        .map(|c| {
            (
                edit_distance(&word.to_ascii_lowercase(), &c.to_ascii_lowercase()),
                c,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_oracle() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("fill_polcy", "fill_policy"), 1);
        assert_eq!(edit_distance("sgi", "sig"), 1);
        assert_eq!(edit_distance("evnet", "event"), 1);
    }

    #[test]
    fn closest_rejects_far_words() {
        assert_eq!(
            closest("fill_polcy", ["size_kb", "fill_policy"]),
            Some("fill_policy")
        );
        assert_eq!(closest("zzz", ["size_kb", "fill_policy"]), None);
    }

    #[test]
    fn render_escapes_control_bytes_and_bounds_long_lines() {
        let src = "a: 1\n  \x1b]0;pwned\x07bad\x1b[2J: 2\n";
        let at = src.find("bad").expect("token");
        let e = TextError::new(at, 3, "unknown field 'bad\x1b[2J'");
        let r = e.render("f\x1b.cfg", src);
        assert!(!r.contains('\x1b') && !r.contains('\x07'), "{r:?}");
        assert!(r.contains("\\u{1b}]0;pwned\\u{7}bad"), "{r}");
        // The caret stays under the token, past the escapes.
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(lines[1].find("bad"), lines[2].find('^'), "{r}");

        let token = "x".repeat(200_000);
        let src = format!("buffers {{ size_kb: 1 }}\n{token}: 1\n");
        let e = TextError::new(25, token.len(), format!("unknown field '{token}'"));
        let r = e.render("f.cfg", &src);
        assert!(r.len() < 2000, "{}", r.len());
        assert!(r.contains("(200016 bytes in all)"), "{r}");
    }

    #[test]
    fn render_points_at_the_token() {
        let src = "a: 1\n  bad_field: 2\n";
        let e = TextError::new(7, 9, "unknown field").with_help(Some("did you mean 'x'?".into()));
        assert_eq!(e.line_col(src), (2, 3));
        assert_eq!(
            e.render("f.cfg", src),
            "f.cfg:2:3: error: unknown field\n  bad_field: 2\n  ^~~~~~~~~\nnote: did you mean 'x'?"
        );
    }
}

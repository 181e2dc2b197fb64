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
    pub fn line_col(&self, src: &str) -> (usize, usize) {
        let at = self.offset.min(src.len());
        let before = &src[..floor_char_boundary(src, at)];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }

    /// Renders the full diagnostic against the source it came from.
    pub fn render(&self, origin: &str, src: &str) -> String {
        let (line, col) = self.line_col(src);
        let at = floor_char_boundary(src, self.offset.min(src.len()));
        let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
        let line_end = src[at..].find('\n').map_or(src.len(), |i| at + i);
        let text = src[line_start..line_end].trim_end_matches('\r');
        // Keep tabs so the caret lines up under the token.
        let pad: String = src[line_start..at]
            .chars()
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        let token_end = floor_char_boundary(src, (at + self.len).min(line_end));
        let width = src[at..token_end].chars().count().max(1);
        let mut out = format!(
            "{origin}:{line}:{col}: error: {}\n{text}\n{pad}^",
            self.message
        );
        out.push_str(&"~".repeat(width - 1));
        if let Some(h) = &self.help {
            out.push_str("\nnote: ");
            out.push_str(h);
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

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Levenshtein distance, for "did you mean" suggestions.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The candidate closest to `word`, if it is close enough to be a likely typo
/// (at most a third of the word's length, and at least 1 edit allowed).
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
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

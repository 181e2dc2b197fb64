//! Tokens of the protobuf text format as Perfetto configs use it.

use super::diagnostic::TextError;

/// What a token is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TokenKind {
    /// A bare word: field name, enum value, `true`, `inf`.
    Ident,
    /// A number as written (sign, prefix, digit separators included).
    Number,
    /// A quoted string, escapes already resolved (bytes; UTF-8 is checked where
    /// a string field needs it).
    Str(Vec<u8>),
    /// One of `: { } < > [ ] ; , /`.
    Punct(char),
    /// End of input.
    Eof,
}

/// A token and where it is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    /// Kind (and the value of a string).
    pub kind: TokenKind,
    /// Byte offset of the first character.
    pub start: usize,
    /// Byte offset just past the last character.
    pub end: usize,
}

/// Splits config text into tokens, skipping whitespace and `#` comments.
pub(crate) struct Lexer<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    /// A lexer at the start of `src`.
    pub(crate) fn new(src: &'a str) -> Self {
        Lexer { src, pos: 0 }
    }

    /// The text of a token.
    pub(crate) fn text(&self, t: &Token) -> &'a str {
        &self.src[t.start..t.end]
    }

    fn peek_byte(&self, at: usize) -> Option<u8> {
        self.src.as_bytes().get(at).copied()
    }

    fn skip_blanks(&mut self) {
        while let Some(b) = self.peek_byte(self.pos) {
            if b == b'#' {
                while let Some(c) = self.peek_byte(self.pos) {
                    if c == b'\n' {
                        break;
                    }
                    self.pos += 1;
                }
            } else if b.is_ascii_whitespace() || b == 0x0b {
                // Vertical tab is whitespace in protobuf text too.
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// The next token.
    pub(crate) fn next_token(&mut self) -> Result<Token, TextError> {
        self.skip_blanks();
        let start = self.pos;
        let Some(b) = self.peek_byte(start) else {
            return Ok(Token {
                kind: TokenKind::Eof,
                start,
                end: start,
            });
        };
        let kind = match b {
            b':' | b'{' | b'}' | b'<' | b'>' | b'[' | b']' | b';' | b',' | b'/' => {
                self.pos += 1;
                TokenKind::Punct(b as char)
            }
            b'"' | b'\'' => TokenKind::Str(self.string(b)?),
            b'-' | b'+' | b'.' | b'0'..=b'9' => {
                self.number();
                TokenKind::Number
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                while self
                    .peek_byte(self.pos)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
                {
                    self.pos += 1;
                }
                TokenKind::Ident
            }
            _ => {
                let ch = self.src[start..].chars().next().unwrap_or('?');
                return Err(TextError::new(
                    start,
                    ch.len_utf8(),
                    format!("unexpected character '{}'", ch.escape_debug()),
                ));
            }
        };
        Ok(Token {
            kind,
            start,
            end: self.pos,
        })
    }

    /// The name inside `[` … `]` of an extension (`my.pkg.my_config`) or an
    /// Any type URL (`type.googleapis.com/pkg.Msg`), as one token: the
    /// ordinary tokens would cut it at each dot. Blanks around it are
    /// skipped; an empty name is an empty token.
    pub(crate) fn bracketed_name(&mut self) -> Token {
        self.skip_blanks();
        let start = self.pos;
        while self
            .peek_byte(self.pos)
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'/'))
        {
            self.pos += 1;
        }
        Token {
            kind: TokenKind::Ident,
            start,
            end: self.pos,
        }
    }

    fn number(&mut self) {
        // Take the widest run that could be part of a number; the parser
        // interprets (and refuses) it with the field's type in hand.
        let start = self.pos;
        self.pos += 1;
        while let Some(c) = self.peek_byte(self.pos) {
            let prev = self.src.as_bytes()[self.pos - 1];
            let is_hex = self.src[start..self.pos].contains(['x', 'X']);
            let exp_sign = (c == b'-' || c == b'+') && (prev == b'e' || prev == b'E') && !is_hex;
            if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || exp_sign {
                self.pos += 1;
            } else {
                break;
            }
        }
        // A lone sign followed by a word (`-inf`) keeps the word.
        if self.pos == start + 1 && matches!(self.src.as_bytes()[start], b'-' | b'+') {
            while self
                .peek_byte(self.pos)
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
            {
                self.pos += 1;
            }
        }
    }

    fn string(&mut self, quote: u8) -> Result<Vec<u8>, TextError> {
        let start = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let Some(c) = self.peek_byte(self.pos) else {
                return Err(TextError::new(start, 1, "unterminated string"));
            };
            match c {
                b'\n' => {
                    return Err(TextError::new(
                        start,
                        self.pos - start,
                        "unterminated string",
                    ));
                }
                c if c == quote => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {
                    let esc_at = self.pos;
                    self.pos += 1;
                    let Some(e) = self.peek_byte(self.pos) else {
                        return Err(TextError::new(start, 1, "unterminated string"));
                    };
                    self.pos += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'a' => out.push(0x07),
                        b'b' => out.push(0x08),
                        b'f' => out.push(0x0c),
                        b'v' => out.push(0x0b),
                        b'?' => out.push(b'?'),
                        b'\\' | b'\'' | b'"' => out.push(e),
                        b'x' | b'X' => {
                            let mut v: u32 = 0;
                            let mut n = 0;
                            while n < 2 {
                                match self
                                    .peek_byte(self.pos)
                                    .and_then(|d| (d as char).to_digit(16))
                                {
                                    Some(d) => {
                                        v = v * 16 + d;
                                        self.pos += 1;
                                        n += 1;
                                    }
                                    None => break,
                                }
                            }
                            if n == 0 {
                                return Err(TextError::new(esc_at, 2, "\\x needs hex digits"));
                            }
                            out.push(v as u8);
                        }
                        b'0'..=b'7' => {
                            let mut v: u32 = u32::from(e - b'0');
                            let mut n = 1;
                            while n < 3 {
                                match self.peek_byte(self.pos) {
                                    Some(d @ b'0'..=b'7') => {
                                        v = v * 8 + u32::from(d - b'0');
                                        self.pos += 1;
                                        n += 1;
                                    }
                                    _ => break,
                                }
                            }
                            let byte = u8::try_from(v).map_err(|_| {
                                TextError::new(esc_at, self.pos - esc_at, "octal escape over \\377")
                            })?;
                            out.push(byte);
                        }
                        _ => {
                            return Err(TextError::new(
                                esc_at,
                                2,
                                format!("unknown escape '\\{}'", e as char),
                            ));
                        }
                    }
                }
                _ => {
                    out.push(c);
                    self.pos += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<TokenKind> {
        let mut l = Lexer::new(src);
        let mut v = Vec::new();
        loop {
            let t = l.next_token().expect("lexes");
            if t.kind == TokenKind::Eof {
                return v;
            }
            v.push(t.kind);
        }
    }

    #[test]
    fn comments_strings_numbers() {
        let k = kinds("a: \"x\\n\\101\\x41\" # c\n b {} -1e-3 0x1F");
        assert_eq!(
            k,
            vec![
                TokenKind::Ident,
                TokenKind::Punct(':'),
                TokenKind::Str(b"x\nAA".to_vec()),
                TokenKind::Ident,
                TokenKind::Punct('{'),
                TokenKind::Punct('}'),
                TokenKind::Number,
                TokenKind::Number,
            ]
        );
    }

    #[test]
    fn unterminated_string() {
        let mut l = Lexer::new("a: \"abc\n");
        l.next_token().expect("ident");
        l.next_token().expect("colon");
        let e = l.next_token().expect_err("unterminated");
        assert_eq!(e.offset, 3);
    }
}

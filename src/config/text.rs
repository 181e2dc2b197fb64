//! The protobuf text format, as Perfetto configs are written: parsed into a
//! [`DynamicMessage`] driven by our descriptors, and printed back.
//!
//! Accepted: `#` comments; `key: value`; `key { … }`, `key: { … }` (and `< … >`);
//! `;` or `,` after a field; enums by name (or by number, any number); strings in either quote
//! with C escapes, adjacent literals joined; repeated fields by repetition (or
//! `key: [a, b]`); decimal, hex (`0x`) and octal (leading `0`) integers with `_`
//! digit separators (`1_000_000`); `true`/`false`; `inf`/`nan` for floats.
//! Strict by default: an unknown field or enum value, a type mismatch, or a
//! singular field (or a second member of a oneof) set twice is an error. Lossy
//! mode skips unknown fields and reports their paths instead.

use prost::bytes::Bytes;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage, Value,
};

use super::diagnostic::{TextError, closest};
use super::token::{Lexer, Token, TokenKind};

/// The outcome of a successful text parse.
#[derive(Debug, Clone)]
pub struct ParsedText {
    /// The message.
    pub message: DynamicMessage,
    /// Paths of the fields skipped in lossy mode (`buffers[0].foo`).
    pub skipped: Vec<String>,
}

/// Parses `src` as a text-format `desc` message.
pub fn parse(src: &str, desc: MessageDescriptor, lossy: bool) -> Result<ParsedText, TextError> {
    let mut p = Parser {
        lex: Lexer::new(src),
        peeked: None,
        lossy,
        skipped: Vec::new(),
        depth: 0,
    };
    let mut msg = DynamicMessage::new(desc);
    p.body(&mut msg, "", None)?;
    Ok(ParsedText {
        message: msg,
        skipped: p.skipped,
    })
}

/// Nesting bound (the binary decoder's too): configs nest a handful of levels;
/// this keeps a hostile input from exhausting the stack.
const MAX_DEPTH: usize = 100;

struct Parser<'a> {
    lex: Lexer<'a>,
    peeked: Option<Token>,
    lossy: bool,
    skipped: Vec<String>,
    depth: usize,
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn describe(t: &Token, text: &str) -> String {
    match &t.kind {
        TokenKind::Eof => "end of input".to_string(),
        TokenKind::Str(_) => "a string".to_string(),
        _ => format!("'{text}'"),
    }
}

impl<'a> Parser<'a> {
    fn next(&mut self) -> Result<Token, TextError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lex.next_token(),
        }
    }

    fn peek(&mut self) -> Result<&Token, TextError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lex.next_token()?);
        }
        Ok(self.peeked.as_ref().expect("just filled"))
    }

    fn unexpected(&self, t: &Token, wanted: &str) -> TextError {
        let len = (t.end - t.start).max(1);
        TextError::new(
            t.start,
            len,
            format!("expected {wanted}, found {}", describe(t, self.lex.text(t))),
        )
    }

    /// Fields until `close` (or end of input at top level).
    fn body(
        &mut self,
        msg: &mut DynamicMessage,
        path: &str,
        close: Option<(char, &Token)>,
    ) -> Result<(), TextError> {
        loop {
            let t = self.next()?;
            match (&t.kind, close) {
                (TokenKind::Eof, None) => return Ok(()),
                (TokenKind::Eof, Some((c, open))) => {
                    return Err(TextError::new(
                        open.start,
                        1,
                        format!(
                            "'{}' is never closed: expected '{c}' before end of input",
                            self.lex.text(open)
                        ),
                    ));
                }
                (TokenKind::Punct(p), Some((c, _))) if *p == c => return Ok(()),
                (TokenKind::Ident, _) => self.field(msg, path, &t)?,
                (TokenKind::Punct('['), _) => {
                    return Err(TextError::new(
                        t.start,
                        1,
                        "extension and Any fields ('[name]') are not supported",
                    ));
                }
                _ => return Err(self.unexpected(&t, "a field name")),
            }
            if let TokenKind::Punct(';' | ',') = self.peek()?.kind {
                self.next()?;
            }
        }
    }

    fn field(
        &mut self,
        msg: &mut DynamicMessage,
        path: &str,
        name_tok: &Token,
    ) -> Result<(), TextError> {
        let name = self.lex.text(name_tok);
        let desc = msg.descriptor();
        let Some(field) = desc.get_field_by_name(name) else {
            if self.lossy {
                self.skipped.push(join(path, name));
                return self.skip_value();
            }
            let names: Vec<String> = desc.fields().map(|f| f.name().to_string()).collect();
            let help = closest(name, names.iter().map(String::as_str))
                .map(|s| format!("did you mean '{s}'?"));
            return Err(TextError::new(
                name_tok.start,
                name.len(),
                format!("unknown field '{name}' in {}", desc.name()),
            )
            .with_help(help));
        };
        let fpath = join(path, name);
        let is_message = matches!(field.kind(), Kind::Message(_));
        let colon = matches!(self.peek()?.kind, TokenKind::Punct(':'));
        if colon {
            self.next()?;
        } else if !is_message {
            let t = self.next()?;
            return Err(self.unexpected(&t, &format!("':' after '{name}'")));
        }
        if field.is_list() && colon && matches!(self.peek()?.kind, TokenKind::Punct('[')) {
            let open = self.next()?;
            if matches!(self.peek()?.kind, TokenKind::Punct(']')) {
                self.next()?;
                return Ok(());
            }
            loop {
                let v = self.value(&field, &fpath, msg)?;
                push_list(msg, &field, v);
                let t = self.next()?;
                match t.kind {
                    TokenKind::Punct(',') => continue,
                    TokenKind::Punct(']') => return Ok(()),
                    TokenKind::Eof => {
                        return Err(TextError::new(open.start, 1, "'[' is never closed"));
                    }
                    _ => return Err(self.unexpected(&t, "',' or ']'")),
                }
            }
        }
        if !field.is_list() {
            self.check_unset(msg, &field, name_tok)?;
        }
        let v = self.value(&field, &fpath, msg)?;
        if field.is_list() {
            push_list(msg, &field, v);
        } else {
            msg.set_field(&field, v);
        }
        Ok(())
    }

    fn check_unset(
        &self,
        msg: &DynamicMessage,
        field: &FieldDescriptor,
        at: &Token,
    ) -> Result<(), TextError> {
        let len = at.end - at.start;
        if msg.has_field(field) {
            return Err(TextError::new(
                at.start,
                len,
                format!("field '{}' is set twice (it is not repeated)", field.name()),
            ));
        }
        if let Some(oneof) = field.containing_oneof()
            && let Some(other) = oneof
                .fields()
                .find(|f| f.number() != field.number() && msg.has_field(f))
        {
            return Err(TextError::new(
                at.start,
                len,
                format!(
                    "'{}' and '{}' are both set, but only one of oneof '{}' may be",
                    other.name(),
                    field.name(),
                    oneof.name()
                ),
            ));
        }
        Ok(())
    }

    /// One value for `field` (a message body or a scalar).
    fn value(
        &mut self,
        field: &FieldDescriptor,
        fpath: &str,
        _parent: &DynamicMessage,
    ) -> Result<Value, TextError> {
        let t = self.next()?;
        match field.kind() {
            Kind::Message(md) => {
                let close = match t.kind {
                    TokenKind::Punct('{') => '}',
                    TokenKind::Punct('<') => '>',
                    _ => {
                        return Err(
                            self.unexpected(&t, &format!("'{{' to open '{}'", field.name()))
                        );
                    }
                };
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(TextError::new(t.start, 1, "messages nested too deeply"));
                }
                let mut sub = DynamicMessage::new(md);
                self.body(&mut sub, fpath, Some((close, &t)))?;
                self.depth -= 1;
                Ok(Value::Message(sub))
            }
            Kind::String | Kind::Bytes => {
                let TokenKind::Str(mut bytes) = t.kind.clone() else {
                    return Err(
                        self.unexpected(&t, &format!("a quoted string for '{}'", field.name()))
                    );
                };
                // Adjacent literals are one string.
                while let TokenKind::Str(more) = &self.peek()?.kind {
                    bytes.extend_from_slice(more);
                    self.next()?;
                }
                if matches!(field.kind(), Kind::Bytes) {
                    return Ok(Value::Bytes(Bytes::from(bytes)));
                }
                String::from_utf8(bytes).map(Value::String).map_err(|_| {
                    TextError::new(t.start, t.end - t.start, "string is not valid UTF-8")
                })
            }
            Kind::Bool => {
                let text = self.lex.text(&t);
                match (&t.kind, text) {
                    (TokenKind::Ident, "true" | "True" | "t") | (TokenKind::Number, "1") => {
                        Ok(Value::Bool(true))
                    }
                    (TokenKind::Ident, "false" | "False" | "f") | (TokenKind::Number, "0") => {
                        Ok(Value::Bool(false))
                    }
                    _ => Err(self.unexpected(&t, &format!("true or false for '{}'", field.name()))),
                }
            }
            Kind::Enum(ed) => {
                let text = self.lex.text(&t);
                match t.kind {
                    TokenKind::Ident => match ed.get_value_by_name(text) {
                        Some(v) => Ok(Value::EnumNumber(v.number())),
                        None => {
                            let names: Vec<String> =
                                ed.values().map(|v| v.name().to_string()).collect();
                            let help = match closest(text, names.iter().map(String::as_str)) {
                                Some(s) => format!("did you mean '{s}'?"),
                                None if names.len() <= 16 => {
                                    format!("valid values: {}", names.join(", "))
                                }
                                None => format!(
                                    "{} has {} values; see its definition",
                                    ed.name(),
                                    names.len()
                                ),
                            };
                            Err(TextError::new(
                                t.start,
                                text.len(),
                                format!(
                                    "unknown value '{text}' for enum {} (field '{}')",
                                    ed.name(),
                                    field.name()
                                ),
                            )
                            .with_help(Some(help)))
                        }
                    },
                    // Any number is taken: a binary config from a newer
                    // schema may carry values we have no name for, and its
                    // text form must read back.
                    TokenKind::Number => {
                        match parse_int(text).and_then(|v| i32::try_from(v).ok()) {
                            Some(n) => Ok(Value::EnumNumber(n)),
                            None => Err(TextError::new(
                                t.start,
                                text.len(),
                                format!("{text} is not a valid number for enum {}", ed.name()),
                            )),
                        }
                    }
                    _ => {
                        Err(self
                            .unexpected(&t, &format!("an enum value name for '{}'", field.name())))
                    }
                }
            }
            Kind::Double | Kind::Float => {
                let text = self.lex.text(&t);
                let v = match t.kind {
                    TokenKind::Number | TokenKind::Ident => parse_float(text),
                    _ => None,
                };
                match v {
                    Some(v) if matches!(field.kind(), Kind::Float) => Ok(Value::F32(v as f32)),
                    Some(v) => Ok(Value::F64(v)),
                    None => Err(self.unexpected(&t, &format!("a number for '{}'", field.name()))),
                }
            }
            kind => {
                let text = self.lex.text(&t);
                if t.kind != TokenKind::Number {
                    return Err(self.unexpected(&t, &format!("an integer for '{}'", field.name())));
                }
                let Some(v) = parse_int(text) else {
                    return Err(TextError::new(
                        t.start,
                        text.len(),
                        format!(
                            "'{text}' is not an integer (decimal, 0x hex or 0 octal, '_' between digits)"
                        ),
                    ));
                };
                let out_of_range = |ty: &str| {
                    TextError::new(
                        t.start,
                        text.len(),
                        format!("{text} is out of range for {ty} field '{}'", field.name()),
                    )
                };
                Ok(match kind {
                    Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
                        Value::I32(i32::try_from(v).map_err(|_| out_of_range("int32"))?)
                    }
                    Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
                        Value::I64(i64::try_from(v).map_err(|_| out_of_range("int64"))?)
                    }
                    Kind::Uint32 | Kind::Fixed32 => {
                        Value::U32(u32::try_from(v).map_err(|_| out_of_range("uint32"))?)
                    }
                    _ => Value::U64(u64::try_from(v).map_err(|_| out_of_range("uint64"))?),
                })
            }
        }
    }

    /// Skips the value of an unknown field (lossy mode): `: scalar`, `: [..]`,
    /// or a `{ … }` block.
    fn skip_value(&mut self) -> Result<(), TextError> {
        if matches!(self.peek()?.kind, TokenKind::Punct(':')) {
            self.next()?;
        }
        let t = self.next()?;
        match t.kind {
            TokenKind::Punct('{' | '<' | '[') => {
                let mut depth = 1usize;
                while depth > 0 {
                    let u = self.next()?;
                    match u.kind {
                        TokenKind::Punct('{' | '<' | '[') => depth += 1,
                        TokenKind::Punct('}' | '>' | ']') => depth -= 1,
                        TokenKind::Eof => {
                            return Err(TextError::new(t.start, 1, "block is never closed"));
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            TokenKind::Str(_) => {
                while let TokenKind::Str(_) = self.peek()?.kind {
                    self.next()?;
                }
                Ok(())
            }
            TokenKind::Ident | TokenKind::Number => Ok(()),
            _ => Err(self.unexpected(&t, "a value")),
        }
    }
}

fn push_list(msg: &mut DynamicMessage, field: &FieldDescriptor, v: Value) {
    if let Value::List(list) = msg.get_field_mut(field) {
        list.push(v);
    }
}

/// Parses an integer as configs write it: optional sign, decimal, `0x` hex or
/// leading-`0` octal, with `_` allowed between digits.
pub fn parse_int(text: &str) -> Option<i128> {
    let (neg, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, digits) =
        if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
            (16, h)
        } else if body.len() > 1 && body.starts_with('0') {
            (8, &body[1..])
        } else {
            (10, body)
        };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    if !clean.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let v = i128::from_str_radix(&clean, radix).ok()?;
    Some(if neg { -v } else { v })
}

fn parse_float(text: &str) -> Option<f64> {
    let lower = text.to_ascii_lowercase();
    let (neg, body) = match lower.strip_prefix('-') {
        Some(b) => (true, b.to_string()),
        None => (false, lower.trim_start_matches('+').to_string()),
    };
    let v = match body.as_str() {
        "inf" | "infinity" => f64::INFINITY,
        "nan" => f64::NAN,
        b => {
            let b = b.strip_suffix('f').unwrap_or(b);
            if !b.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                return None;
            }
            let clean: String = b.chars().filter(|c| *c != '_').collect();
            match clean.parse::<f64>() {
                Ok(v) => v,
                Err(_) => parse_int(&clean)? as f64,
            }
        }
    };
    Some(if neg { -v } else { v })
}

/// Prints `msg` in the text format [`parse`] reads back. Unknown fields have no
/// text form; the caller learns how many were left out.
pub fn print(msg: &DynamicMessage) -> (String, usize) {
    let mut out = String::new();
    let mut dropped = 0;
    print_body(msg, 0, &mut out, &mut dropped);
    (out, dropped)
}

fn print_body(msg: &DynamicMessage, indent: usize, out: &mut String, dropped: &mut usize) {
    *dropped += msg.unknown_fields().count();
    let mut fields: Vec<(FieldDescriptor, &Value)> = msg.fields().collect();
    fields.sort_by_key(|(f, _)| f.number());
    for (f, v) in fields {
        match v {
            Value::List(items) => {
                for item in items {
                    print_field(&f, item, indent, out, dropped);
                }
            }
            v => print_field(&f, v, indent, out, dropped),
        }
    }
}

fn print_field(
    f: &FieldDescriptor,
    v: &Value,
    indent: usize,
    out: &mut String,
    dropped: &mut usize,
) {
    let pad = "  ".repeat(indent);
    out.push_str(&pad);
    out.push_str(f.name());
    match v {
        Value::Message(m) => {
            out.push_str(" {\n");
            print_body(m, indent + 1, out, dropped);
            out.push_str(&pad);
            out.push_str("}\n");
            return;
        }
        _ => out.push_str(": "),
    }
    match v {
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::I32(x) => out.push_str(&x.to_string()),
        Value::I64(x) => out.push_str(&x.to_string()),
        Value::U32(x) => out.push_str(&x.to_string()),
        Value::U64(x) => out.push_str(&x.to_string()),
        Value::F32(x) => out.push_str(&float_text(f64::from(*x))),
        Value::F64(x) => out.push_str(&float_text(*x)),
        Value::String(s) => quote(s.as_bytes(), out),
        Value::Bytes(b) => quote(b, out),
        Value::EnumNumber(n) => match f.kind() {
            Kind::Enum(ed) => match ed.get_value(*n) {
                Some(ev) => out.push_str(ev.name()),
                None => out.push_str(&n.to_string()),
            },
            _ => out.push_str(&n.to_string()),
        },
        Value::Message(_) | Value::List(_) | Value::Map(_) => {}
    }
    out.push('\n');
}

fn float_text(x: f64) -> String {
    if x.is_nan() {
        "nan".to_string()
    } else if x.is_infinite() {
        if x > 0.0 {
            "inf".to_string()
        } else {
            "-inf".to_string()
        }
    } else {
        // `{:?}` is the shortest text that reads back to the same value.
        format!("{x:?}")
    }
}

fn quote(bytes: &[u8], out: &mut String) {
    out.push('"');
    // Valid UTF-8 is kept as is (readable); anything else is escaped byte-wise.
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        out.push_str(&format!("\\{:03o}", c as u32))
                    }
                    c => out.push(c),
                }
            }
        }
        Err(_) => {
            for &b in bytes {
                match b {
                    b'"' => out.push_str("\\\""),
                    b'\\' => out.push_str("\\\\"),
                    0x20..=0x7e => out.push(b as char),
                    _ => out.push_str(&format!("\\{b:03o}")),
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers() {
        assert_eq!(parse_int("1_000_000_000"), Some(1_000_000_000));
        assert_eq!(parse_int("0x1F"), Some(31));
        assert_eq!(parse_int("017"), Some(15));
        assert_eq!(parse_int("-5"), Some(-5));
        assert_eq!(parse_int("0"), Some(0));
        assert_eq!(parse_int("1__0"), None);
        assert_eq!(parse_int("_1"), None);
        assert_eq!(parse_int("09"), None);
        assert_eq!(parse_int("12abc"), None);
    }

    #[test]
    fn floats() {
        assert_eq!(parse_float("0.5"), Some(0.5));
        assert_eq!(parse_float("1e3"), Some(1000.0));
        assert_eq!(parse_float("-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_float("abc"), None);
    }
}

//! The protobuf text format, as Perfetto configs are written: parsed into a
//! [`DynamicMessage`] driven by our descriptors, and printed back.
//!
//! Accepted: `#` comments; `key: value`; `key { … }`, `key: { … }` (and `< … >`);
//! `;` or `,` after a field; enums by name (or by number, any number); strings in either quote
//! with C escapes, adjacent literals joined; repeated fields by repetition (or
//! `key: [a, b]`); decimal, hex (`0x`) and octal (leading `0`) integers with `_`
//! digit separators (`1_000_000`); `true`/`false`; `inf`/`nan` for floats.
//! Extensions by full name in brackets (`[my.pkg.my_config] { … }`), from the
//! descriptor pool the message comes from (the user's `.proto` files, see
//! [`super::schema`]). Fields the schema does not know, by number
//! (`10000001: "…"`), as the printer writes them so that nothing a binary
//! config carries is lost: varints in decimal, fixed32 and fixed64 as `0x`
//! with 8 and 16 hex digits, length-delimited values as byte strings, groups
//! as `N { … }`.
//! Strict by default: an unknown field or enum value, a type mismatch, or a
//! singular field (or a second member of a oneof) set twice is an error. Lossy
//! mode skips unknown fields and reports their paths instead.

use prost::Message;
use prost::bytes::Bytes;
use prost_reflect::{
    DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage,
    Value,
};

use super::diagnostic::{TextError, closest};
use super::token::{Lexer, Token, TokenKind};
use crate::wire::{self, WireType, varint};

/// The outcome of a successful text parse.
#[derive(Debug, Clone)]
pub(crate) struct ParsedText {
    /// The message.
    pub message: DynamicMessage,
    /// Paths of the fields skipped in lossy mode (`buffers[0].foo`).
    pub skipped: Vec<String>,
}

/// Parses `src` as a text-format `desc` message.
pub(crate) fn parse(
    src: &str,
    desc: MessageDescriptor,
    lossy: bool,
) -> Result<ParsedText, TextError> {
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

/// What a name in the text sets: a field of the message, or an extension.
#[derive(Debug, Clone)]
enum Slot {
    Field(FieldDescriptor),
    Extension(ExtensionDescriptor),
}

impl Slot {
    fn kind(&self) -> Kind {
        match self {
            Slot::Field(f) => f.kind(),
            Slot::Extension(e) => e.kind(),
        }
    }

    /// As written in the text: `name` or `[full.name]`.
    fn name(&self) -> String {
        match self {
            Slot::Field(f) => f.name().to_string(),
            Slot::Extension(e) => format!("[{}]", e.full_name()),
        }
    }

    fn is_list(&self) -> bool {
        match self {
            Slot::Field(f) => f.is_list(),
            Slot::Extension(e) => e.is_list(),
        }
    }

    fn is_set(&self, msg: &DynamicMessage) -> bool {
        match self {
            Slot::Field(f) => msg.has_field(f),
            Slot::Extension(e) => msg.has_extension(e),
        }
    }

    fn set(&self, msg: &mut DynamicMessage, v: Value) {
        match self {
            Slot::Field(f) => msg.set_field(f, v),
            Slot::Extension(e) => msg.set_extension(e, v),
        }
    }

    fn push(&self, msg: &mut DynamicMessage, v: Value) {
        let list = match self {
            Slot::Field(f) => msg.get_field_mut(f),
            Slot::Extension(e) => msg.get_extension_mut(e),
        };
        if let Value::List(list) = list {
            list.push(v);
        }
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
                (TokenKind::Punct('['), _) => self.extension(msg, path, &t)?,
                (TokenKind::Number, _) => self.unknown_field(msg, &t)?,
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
        self.assign(msg, Slot::Field(field), &join(path, name), name_tok)
    }

    /// `[full.name] …`: an extension of this message from its pool.
    fn extension(
        &mut self,
        msg: &mut DynamicMessage,
        path: &str,
        open: &Token,
    ) -> Result<(), TextError> {
        let name_tok = self.lex.bracketed_name();
        let name = self.lex.text(&name_tok);
        let close = self.next()?;
        if !matches!(close.kind, TokenKind::Punct(']')) {
            return Err(self.unexpected(&close, &format!("']' to close '[{name}'")));
        }
        if name.is_empty() {
            return Err(self.unexpected(&close, "an extension name after '['"));
        }
        let at = (name_tok.start, name.len());
        if name.contains('/') {
            return Err(TextError::new(
                at.0,
                at.1,
                "Any fields ('[type.url/Message]') are not supported",
            ));
        }
        let desc = msg.descriptor();
        let full = name.strip_prefix('.').unwrap_or(name);
        let Some(ext) = desc.get_extension_by_full_name(full) else {
            if self.lossy {
                self.skipped.push(join(path, &format!("[{full}]")));
                return self.skip_value();
            }
            let pool = desc.parent_pool();
            if let Some(other) = pool.get_extension_by_name(full) {
                return Err(TextError::new(
                    at.0,
                    at.1,
                    format!(
                        "extension '[{full}]' extends {}, not {}",
                        other.containing_message().full_name(),
                        desc.full_name()
                    ),
                ));
            }
            let names: Vec<String> = desc
                .extensions()
                .map(|e| e.full_name().to_string())
                .collect();
            let help = match closest(full, names.iter().map(String::as_str)) {
                Some(s) => format!("did you mean '[{s}]'?"),
                None if names.is_empty() => format!(
                    "{} has no custom fields loaded: pass the .proto that declares them with --proto FILE (or --descriptor-set FILE)",
                    desc.name()
                ),
                None => format!("known here: {}", names.join(", ")),
            };
            return Err(TextError::new(
                at.0,
                at.1,
                format!("unknown extension '[{full}]' in {}", desc.name()),
            )
            .with_help(Some(help)));
        };
        let fpath = join(path, &format!("[{full}]"));
        let span = Token {
            kind: TokenKind::Ident,
            start: open.start,
            end: close.end,
        };
        self.assign(msg, Slot::Extension(ext), &fpath, &span)
    }

    /// `N: value` or `N { … }`: a field by number, as the printer writes
    /// fields the schema does not know. Its bytes are merged into the
    /// message, so a number the schema does know decodes as that field.
    fn unknown_field(
        &mut self,
        msg: &mut DynamicMessage,
        num_tok: &Token,
    ) -> Result<(), TextError> {
        let mut bytes = Vec::new();
        let number = self.unknown_value(num_tok, &mut bytes)?;
        msg.merge(bytes.as_slice()).map_err(|e| {
            let known = msg
                .descriptor()
                .get_field(number)
                .map(|f| f.name().to_string())
                .or_else(|| {
                    msg.descriptor()
                        .get_extension(number)
                        .map(|e| format!("[{}]", e.full_name()))
                });
            TextError::new(
                num_tok.start,
                num_tok.end - num_tok.start,
                match known {
                    Some(n) => format!(
                        "field {number} is '{n}' in {}, and this value does not decode as it: {e}",
                        msg.descriptor().name()
                    ),
                    None => format!("field {number} does not decode: {e}"),
                },
            )
        })?;
        Ok(())
    }

    /// Encodes one unknown field (its number token already read) into `out`.
    fn unknown_value(&mut self, num_tok: &Token, out: &mut Vec<u8>) -> Result<u32, TextError> {
        let text = self.lex.text(num_tok);
        let number = text
            .parse::<u32>()
            .ok()
            .filter(|n| (wire::key::MIN_FIELD..=wire::key::MAX_FIELD).contains(n))
            .ok_or_else(|| {
                TextError::new(
                    num_tok.start,
                    text.len(),
                    format!(
                        "'{text}' is not a field name or a field number (1 to {})",
                        wire::key::MAX_FIELD
                    ),
                )
            })?;
        let tag = |wt: WireType| wire::key(number, wt);
        let t = self.next()?;
        match t.kind {
            TokenKind::Punct('{') => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(TextError::new(t.start, 1, "messages nested too deeply"));
                }
                varint::push(out, tag(WireType::StartGroup));
                loop {
                    let u = self.next()?;
                    match u.kind {
                        TokenKind::Punct('}') => break,
                        TokenKind::Number => {
                            self.unknown_value(&u, out)?;
                        }
                        TokenKind::Eof => {
                            return Err(TextError::new(t.start, 1, "'{' is never closed"));
                        }
                        _ => return Err(self.unexpected(&u, "a field number or '}'")),
                    }
                    if let TokenKind::Punct(';' | ',') = self.peek()?.kind {
                        self.next()?;
                    }
                }
                varint::push(out, tag(WireType::EndGroup));
                self.depth -= 1;
            }
            TokenKind::Punct(':') => {
                let v = self.next()?;
                let vtext = self.lex.text(&v);
                match &v.kind {
                    TokenKind::Str(first) => {
                        let mut bytes = first.clone();
                        while let TokenKind::Str(more) = &self.peek()?.kind {
                            bytes.extend_from_slice(more);
                            self.next()?;
                        }
                        varint::push(out, tag(WireType::Len));
                        varint::push(out, bytes.len() as u64);
                        out.extend_from_slice(&bytes);
                    }
                    TokenKind::Number => {
                        let hex_digits = vtext
                            .strip_prefix("0x")
                            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                            .map(str::len);
                        let value = parse_int(vtext)
                            .and_then(|v| u64::try_from(v).ok())
                            .ok_or_else(|| {
                                TextError::new(
                                    v.start,
                                    vtext.len(),
                                    format!(
                                        "'{vtext}' is not a value for field {number}: a number from 0 to 2^64-1, or a quoted string"
                                    ),
                                )
                            })?;
                        match hex_digits {
                            Some(8) => {
                                let v32 = u32::try_from(value).map_err(|_| {
                                    TextError::new(v.start, vtext.len(), "out of range")
                                })?;
                                varint::push(out, tag(WireType::Fixed32));
                                out.extend_from_slice(&v32.to_le_bytes());
                            }
                            Some(16) => {
                                varint::push(out, tag(WireType::Fixed64));
                                out.extend_from_slice(&value.to_le_bytes());
                            }
                            _ => {
                                varint::push(out, tag(WireType::Varint));
                                varint::push(out, value);
                            }
                        }
                    }
                    _ => {
                        return Err(self.unexpected(
                            &v,
                            &format!("a number or a quoted string for field {number}"),
                        ));
                    }
                }
            }
            _ => return Err(self.unexpected(&t, &format!("':' or '{{' after field {number}"))),
        }
        Ok(number)
    }

    /// The value(s) after a field's or extension's name.
    fn assign(
        &mut self,
        msg: &mut DynamicMessage,
        field: Slot,
        fpath: &str,
        name_tok: &Token,
    ) -> Result<(), TextError> {
        let name = field.name();
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
                let v = self.value(&field, fpath)?;
                field.push(msg, v);
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
        let v = self.value(&field, fpath)?;
        if field.is_list() {
            field.push(msg, v);
        } else {
            field.set(msg, v);
        }
        Ok(())
    }

    fn check_unset(&self, msg: &DynamicMessage, slot: &Slot, at: &Token) -> Result<(), TextError> {
        let len = at.end - at.start;
        if slot.is_set(msg) {
            return Err(TextError::new(
                at.start,
                len,
                format!("field '{}' is set twice (it is not repeated)", slot.name()),
            ));
        }
        if let Slot::Field(field) = slot
            && let Some(oneof) = field.containing_oneof()
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
    fn value(&mut self, field: &Slot, fpath: &str) -> Result<Value, TextError> {
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

/// The radix an unsigned integer literal is written in and its digits:
/// `0x`/`0X` hex, a leading `0` octal, else decimal (C's rules, which
/// both protobuf's text format and the kernel's filters follow).
pub(crate) fn radix_and_digits(body: &str) -> (u32, &str) {
    if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        (16, h)
    } else if body.len() > 1 && body.starts_with('0') {
        (8, &body[1..])
    } else {
        (10, body)
    }
}

/// Parses an integer as configs write it: optional sign, decimal, `0x` hex or
/// leading-`0` octal, with `_` allowed between digits.
pub(crate) fn parse_int(text: &str) -> Option<i128> {
    let (neg, body) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, digits) = radix_and_digits(body);
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

/// Prints `msg` in the text format [`parse`] reads back: fields, then
/// extensions by their full names, then fields the schema does not know by
/// number (nothing is left out).
pub(crate) fn print(msg: &DynamicMessage) -> String {
    let mut out = String::new();
    print_body(msg, 0, &mut out);
    out
}

/// A value on one line, as `config check` shows a custom field: the text
/// form with its line breaks folded, cut at `max` characters.
pub(crate) fn print_inline(slot_kind: &Kind, v: &Value, max: usize) -> String {
    let mut out = String::new();
    match v {
        Value::Message(m) => {
            out.push_str("{ ");
            let mut body = String::new();
            print_body(m, 0, &mut body);
            out.push_str(&body.split_whitespace().collect::<Vec<_>>().join(" "));
            out.push_str(" }");
        }
        Value::List(items) => {
            let parts: Vec<String> = items
                .iter()
                .map(|i| print_inline(slot_kind, i, max))
                .collect();
            out = format!("[{}]", parts.join(", "));
        }
        v => scalar_text(slot_kind, v, &mut out),
    }
    if out.chars().count() > max {
        out = out.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
    }
    out
}

fn print_body(msg: &DynamicMessage, indent: usize, out: &mut String) {
    let mut fields: Vec<(FieldDescriptor, &Value)> = msg.fields().collect();
    fields.sort_by_key(|(f, _)| f.number());
    for (f, v) in fields {
        print_named(f.name(), &f.kind(), v, indent, out);
    }
    let mut exts: Vec<(ExtensionDescriptor, &Value)> = msg.extensions().collect();
    exts.sort_by_key(|(e, _)| e.number());
    for (e, v) in exts {
        print_named(&format!("[{}]", e.full_name()), &e.kind(), v, indent, out);
    }
    let mut raw = Vec::new();
    for u in msg.unknown_fields() {
        u.encode(&mut raw);
    }
    print_raw(&raw, indent, out);
}

fn print_named(name: &str, kind: &Kind, v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::List(items) => {
            for item in items {
                print_field(name, kind, item, indent, out);
            }
        }
        v => print_field(name, kind, v, indent, out),
    }
}

/// Fields by number from their wire bytes (see the module docs for the form).
fn print_raw(raw: &[u8], indent: usize, out: &mut String) {
    let pad = "  ".repeat(indent);
    // Our own encoding of fields the decoder kept: always well-formed.
    for f in wire::fields(raw).map_while(Result::ok) {
        out.push_str(&pad);
        out.push_str(&f.number.to_string());
        match f.value {
            wire::Value::Varint(v) => out.push_str(&format!(": {v}\n")),
            wire::Value::Fixed64(v) => out.push_str(&format!(": 0x{v:016x}\n")),
            wire::Value::Fixed32(v) => out.push_str(&format!(": 0x{v:08x}\n")),
            wire::Value::Len(bytes) => {
                out.push_str(": ");
                quote(bytes, out);
                out.push('\n');
            }
            wire::Value::Group(body) => {
                out.push_str(" {\n");
                print_raw(body, indent + 1, out);
                out.push_str(&pad);
                out.push_str("}\n");
            }
        }
    }
}

fn print_field(name: &str, kind: &Kind, v: &Value, indent: usize, out: &mut String) {
    let pad = "  ".repeat(indent);
    out.push_str(&pad);
    out.push_str(name);
    if let Value::Message(m) = v {
        out.push_str(" {\n");
        print_body(m, indent + 1, out);
        out.push_str(&pad);
        out.push_str("}\n");
        return;
    }
    out.push_str(": ");
    scalar_text(kind, v, out);
    out.push('\n');
}

fn scalar_text(kind: &Kind, v: &Value, out: &mut String) {
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
        Value::EnumNumber(n) => match kind {
            Kind::Enum(ed) => match ed.get_value(*n) {
                Some(ev) => out.push_str(ev.name()),
                None => out.push_str(&n.to_string()),
            },
            _ => out.push_str(&n.to_string()),
        },
        Value::Message(_) | Value::List(_) | Value::Map(_) => {}
    }
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
    fn fields_by_number_print_and_read_back_byte_for_byte() {
        let desc = crate::config::trace_config_descriptor();
        // A varint, fixed64, fixed32, bytes and a group holding a nested group,
        // all unknown to TraceConfig (numbers 5000..5004).
        let mut raw = Vec::new();
        raw.extend_from_slice(&[0xc0, 0xb8, 0x02, 0xff, 0x01]); // 5000: 255
        raw.extend_from_slice(&[0xc9, 0xb8, 0x02]); // 5001: fixed64
        raw.extend_from_slice(&1u64.to_le_bytes());
        raw.extend_from_slice(&[0xd5, 0xb8, 0x02]); // 5002: fixed32
        raw.extend_from_slice(&0xdead_beef_u32.to_le_bytes());
        raw.extend_from_slice(&[0xda, 0xb8, 0x02, 0x03, 0x00, 0xff, b'"']); // 5003: bytes
        raw.extend_from_slice(&[0xe3, 0xb8, 0x02, 0x08, 0x07, 0x13, 0x14, 0xe4, 0xb8, 0x02]); // 5004 { 1: 7 2 { } }
        let msg = DynamicMessage::decode(desc.clone(), raw.as_slice()).expect("decodes");
        let text = print(&msg);
        assert_eq!(
            text,
            "5000: 255\n5001: 0x0000000000000001\n5002: 0xdeadbeef\n5003: \"\\000\\377\\\"\"\n5004 {\n  1: 7\n  2 {\n  }\n}\n"
        );
        let back = parse(&text, desc, false).expect("parses");
        assert_eq!(back.message.encode_to_vec(), raw);
    }

    #[test]
    fn fields_by_number_that_do_not_fit_are_diagnosed() {
        let desc = crate::config::trace_config_descriptor();
        let err = |src: &str| {
            parse(src, desc.clone(), false)
                .expect_err("refused")
                .message
        };
        assert!(err("0: 1").contains("not a field name or a field number"));
        assert!(err("536870912: 1").contains("not a field name or a field number"));
        assert!(err("5000: -1").contains("not a value for field 5000"));
        assert!(err("5000 1").contains("expected ':' or '{' after field 5000"));
        // Field 3 is duration_ms (a varint): a string does not decode as it.
        assert!(err("3: \"x\"").contains("field 3 is 'duration_ms' in TraceConfig"));
        // A known number with a fitting value is that field.
        let ok = parse("3: 1000", desc, false).expect("parses");
        assert_eq!(ok.message.encode_to_vec(), vec![0x18, 0xe8, 0x07]);
    }

    #[test]
    fn floats() {
        assert_eq!(parse_float("0.5"), Some(0.5));
        assert_eq!(parse_float("1e3"), Some(1000.0));
        assert_eq!(parse_float("-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_float("abc"), None);
    }
}

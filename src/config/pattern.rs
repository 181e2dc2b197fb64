//! Regular expressions of configs (producer filters, trigger regexes):
//! how they match and what bounds them, checked at load and used by the
//! session.

/// Compiles `pattern` for whole-string matching, as Perfetto's producer
/// filters and trigger regexes match.
/// With a compiled size of at most [`REGEX_SIZE_LIMIT`]: compile time grows
/// with it, and a producer or trigger name needs little.
pub(crate) fn anchored(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
}

/// The largest compiled regular expression (producer and trigger filters).
pub(crate) const REGEX_SIZE_LIMIT: usize = 256 * 1024;
/// Distinct regular expressions one config may hold.
pub(crate) const MAX_DISTINCT_REGEXES: usize = 64;

//! What became of each config field: applied as written, applied with a
//! change, or ignored (with why).

/// The fate of one field the config sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldStatus {
    /// Used as written; the text says how where that is not obvious.
    Applied(String),
    /// Used, with a different value or meaning: how.
    Changed(String),
    /// No effect: why.
    Ignored(String),
}

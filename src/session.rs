//! Tracing-session lifecycle decisions (pure).

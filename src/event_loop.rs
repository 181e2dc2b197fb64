//! Executes the session's decisions: one blocking wait, then a match on the event.

//! The subcommands' bodies (layer 5, beside `cli`): each takes parsed
//! arguments, calls the library, prints for people and returns the exit code.

pub mod bench;
pub mod control;
pub mod inspect;
pub mod open;
pub mod record;

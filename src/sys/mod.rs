//! Thin, audited wrappers over the Linux system calls the recorder needs.
//! `unsafe` is allowed here; every block cites an invariant.
#![allow(unsafe_code)]
pub mod daemon;
pub mod fd;
pub mod heap;
pub mod iov;
pub mod nowait;
pub mod privdrop;
pub mod sched;
pub mod signals;
pub mod trace_map;

//! Thin, audited wrappers over the Linux system calls the recorder needs.
//! `unsafe` is allowed here; every block cites an invariant.
#![allow(unsafe_code)]
pub(crate) mod daemon;
pub(crate) mod fd;
pub(crate) mod heap;
pub(crate) mod iov;
pub(crate) mod nowait;
pub(crate) mod privdrop;
pub(crate) mod sched;
pub(crate) mod signals;
pub(crate) mod trace_map;

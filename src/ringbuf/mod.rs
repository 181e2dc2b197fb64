//! The buffer engine: zero-copy, mmap'd, chunked ring buffers.
#![allow(unsafe_code)]

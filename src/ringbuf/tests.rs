//! Unit tests of the buffer engine; the model test is in `tests/model.rs`.

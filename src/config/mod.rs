//! TraceConfig loading (text and binary), validation into typed specs.

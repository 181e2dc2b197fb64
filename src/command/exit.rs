//! The binary's exit codes, documented in `--help` and the README.

/// How a command ends. Unlike Perfetto's `perfetto`, a refused config is not
/// a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// Done as asked. A recording stopped by SIGINT or SIGTERM ends so too,
    /// whenever the signal came, during set-up included: the trace is valid
    /// (with only the recorder's own packets when nothing was recorded yet).
    Success = 0,
    /// A runtime failure: an I/O error, a full disk, the kernel refused, a
    /// session could not be reached.
    Runtime = 1,
    /// Bad usage or a config error: nothing was started.
    Usage = 2,
    /// `recover`: a valid trace was written, but parts of the rings were
    /// damaged (or whole buffers unreadable) and left out; the report
    /// says which.
    Partial = 3,
}

impl ExitCode {
    /// The worse of two outcomes (for commands acting on several sessions).
    #[must_use]
    pub fn max(self, other: ExitCode) -> ExitCode {
        if other as u8 > self as u8 {
            other
        } else {
            self
        }
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(c: ExitCode) -> Self {
        std::process::ExitCode::from(c as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn help_documents_every_exit_code() {
        let help = crate::cli::Cli::command().render_long_help().to_string();
        for c in [
            ExitCode::Success,
            ExitCode::Runtime,
            ExitCode::Usage,
            ExitCode::Partial,
        ] {
            assert!(help.contains(&format!("  {}  ", c as u8)), "{c:?}: {help}");
        }
    }

    #[test]
    fn max_keeps_the_worse() {
        assert_eq!(ExitCode::Success.max(ExitCode::Runtime), ExitCode::Runtime);
        assert_eq!(ExitCode::Usage.max(ExitCode::Runtime), ExitCode::Usage);
    }
}

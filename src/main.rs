//! The `recorder` binary: argument parsing lives in `recorder::cli`; this file
//! only maps its outcome to the process exit code.

fn main() -> std::process::ExitCode {
    recorder::cli::main()
}

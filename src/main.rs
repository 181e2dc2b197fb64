//! The `recorder` binary: everything lives in the library; argument types in
//! `recorder::cli`, the commands in `recorder::command`.

fn main() -> std::process::ExitCode {
    recorder::command::main()
}

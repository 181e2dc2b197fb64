//! `recorder completions SHELL`: the completion script, made from the clap
//! definitions (`crate::cli`), so it never drifts from `--help`.

use clap::CommandFactory;
use clap_complete::Shell;

use super::ExitCode;
use crate::cli::Cli;

/// The script `shell` loads, as packages install it (bash:
/// `/usr/share/bash-completion/completions/recorder`; zsh: `_recorder` on
/// `$fpath`; fish: `vendor_completions.d/recorder.fish`).
pub(crate) fn script(shell: Shell) -> Vec<u8> {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "recorder", &mut out);
    out
}

/// Prints the script for `shell` on stdout.
pub(crate) fn run(shell: Shell) -> ExitCode {
    match super::print_out(String::from_utf8_lossy(&script(shell))) {
        Ok(()) => ExitCode::Success,
        Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_script_naming_the_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let s = String::from_utf8(script(shell)).expect("utf-8");
            for sub in ["config", "inspect", "serve", "completions", "man-pages"] {
                assert!(s.contains(sub), "{shell}: {sub}");
            }
        }
    }
}

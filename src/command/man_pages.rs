//! `recorder man-pages DIR`: `recorder.1` and a page per subcommand
//! (`recorder-config-check.1`, …), made from the clap definitions
//! (`crate::cli`), so they never drift from `--help`.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::ExitCode;
use crate::cli::Cli;

/// Every page: its file name and its roff text.
pub fn pages() -> Result<Vec<(String, Vec<u8>)>, std::io::Error> {
    fn walk(cmd: &clap::Command, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
        let man = clap_mangen::Man::new(cmd.clone());
        let mut text = Vec::new();
        man.render(&mut text)?;
        out.push((man.get_filename(), text));
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, out)?;
        }
        Ok(())
    }
    // Built once at the top: each subcommand then carries its full name
    // (`recorder-config-check`) and usage (`recorder config check`).
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, &mut out)?;
    Ok(out)
}

/// Writes every page into `dir` (made if missing), each file new (never
/// through a link); prints their paths.
pub(crate) fn run(dir: &Path) -> ExitCode {
    let pages = match pages() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot render the man pages: {e}");
            return ExitCode::Runtime;
        }
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: {}: {e}", dir.display());
        return ExitCode::Runtime;
    }
    let mut written = String::new();
    for (name, text) in pages {
        let path: PathBuf = dir.join(&name);
        if let Err(e) = crate::storage::create::write_file(&path, &text) {
            eprintln!("error: {}: {e}", path.display());
            return ExitCode::Runtime;
        }
        written.push_str(&format!("{}\n", path.display()));
    }
    match super::print_out(written) {
        Ok(()) => ExitCode::Success,
        Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_for_recorder_and_each_subcommand() {
        let pages = pages().expect("rendered");
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        for want in [
            "recorder.1",
            "recorder-config.1",
            "recorder-config-check.1",
            "recorder-config-convert.1",
            "recorder-inspect.1",
            "recorder-serve.1",
            "recorder-completions.1",
        ] {
            assert!(names.contains(&want), "{want}: {names:?}");
        }
        let (_, top) = &pages[0];
        let top = String::from_utf8_lossy(top);
        assert!(top.starts_with(".ie") || top.contains(".TH"), "{top}");
        // The light-mode flags are documented where people look.
        assert!(top.contains("\\-\\-dry\\-run"), "{top}");
    }
}

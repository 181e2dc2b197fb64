//! `recorder config check` and `recorder config convert`.

use std::io::Write;
use std::path::Path;

use super::ExitCode;
use crate::cli::{FormArgs, ProtoArgs, TargetForm};
use crate::config::{self, ConfigError, ConfigForm, LoadOptions, LoadedConfig, Schema};

/// Longest config error printed: a message built from a huge token stays
/// a message.
const MAX_ERROR_BYTES: usize = 4096;

/// Prints a config error (it carries its own `file:line:col` and caret),
/// with control characters escaped (the config is untrusted text) and cut
/// to MAX_ERROR_BYTES.
pub fn report(e: &ConfigError) -> ExitCode {
    let mut text = config::diagnostic::terminal_safe(&e.to_string());
    if text.len() > MAX_ERROR_BYTES {
        let cut = (0..=MAX_ERROR_BYTES)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        let all = text.len();
        text.truncate(cut);
        text.push_str(&format!("… ({all} bytes of error in all)"));
    }
    eprintln!("{text}");
    ExitCode::Usage
}

/// Loads `file` against our schema and the user's (`--proto`, …).
pub fn load(file: &Path, opts: LoadOptions, protos: &ProtoArgs) -> Result<LoadedConfig, ExitCode> {
    let schema = Schema::load(&protos.user_protos()).map_err(|e| report(&e.into()))?;
    config::load_path_in(file, opts, &schema).map_err(|e| report(&e))
}

/// Whether a session of `spec` opens the producer socket, and where (as
/// `recorder --config` without `--producer-socket` would).
fn producer_socket_line(spec: &config::RecorderSpec) -> String {
    use crate::ipc::socket_path::Opening;
    match crate::app::producer_opening(spec, None, false) {
        Ok(Opening::Closed) => "producer socket: stays closed (every data source is built in; \
             --producer-socket PATH lets apps connect)\n"
            .to_string(),
        Ok(Opening::Open { path, reason }) => {
            format!("producer socket: opens at {} ({reason})\n", path.display())
        }
        Err(e) => format!("producer socket: cannot open: {e}\n"),
    }
}

/// Validates `file` and prints the plan; with `explain`, every field's fate.
pub fn check(file: &Path, form: &FormArgs, explain: bool) -> ExitCode {
    let loaded = match load(file, form.options(), &form.protos) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let spec = match loaded.validate() {
        Ok(spec) => spec,
        Err(e) => return report(&e),
    };
    let form = match loaded.form {
        ConfigForm::Text => "text",
        ConfigForm::Binary => "binary",
    };
    // Names in the plan come from the config: shown escaped.
    let head = config::diagnostic::terminal_safe(&format!(
        "{}: valid {form} config\n{}",
        loaded.origin,
        config::plan::describe(&spec)
    ));
    if let Err(code) = super::print_out(head) {
        return code;
    }
    if let Err(code) = super::print_out(producer_socket_line(&spec)) {
        return code;
    }
    if file != Path::new("-") {
        match config::segments::load_adjacent(file) {
            Ok(Some((path, policy))) => {
                if let Err(code) =
                    super::print_out(config::segments::describe(&policy, Some(&path)))
                {
                    return code;
                }
                if policy.check().is_err() {
                    return ExitCode::Usage;
                }
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::Usage;
            }
        }
    }
    if explain {
        let fields = format!(
            "fields:\n{}",
            config::fields::explain(&spec.fields, &spec.unknown_fields)
        );
        if let Err(code) = super::print_out(fields) {
            return code;
        }
    }
    ExitCode::Success
}

/// Converts `file` to the other form (or `to`), onto `out` or stdout.
pub fn convert(
    file: &Path,
    to: Option<TargetForm>,
    out: Option<&Path>,
    form: &FormArgs,
) -> ExitCode {
    let loaded = match load(file, form.options(), &form.protos) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let to = to.unwrap_or(match loaded.form {
        ConfigForm::Text => TargetForm::Binary,
        ConfigForm::Binary => TargetForm::Text,
    });
    let bytes = match to {
        TargetForm::Binary => loaded.bytes.clone(),
        TargetForm::Text => {
            if !loaded.unknown_fields.is_empty() {
                log::info!(
                    "field(s) the schema does not know are printed by number: {}",
                    loaded.unknown_fields.join(", ")
                );
            }
            loaded.to_text().into_bytes()
        }
    };
    let result = match out {
        Some(p) if p != Path::new("-") => {
            crate::storage::create::write_file(p, &bytes).map_err(std::io::Error::other)
        }
        _ => std::io::stdout().write_all(&bytes),
    };
    match result {
        Ok(()) => ExitCode::Success,
        Err(e) => {
            eprintln!("error: cannot write output: {e}");
            ExitCode::Runtime
        }
    }
}

//! `recorder config check` and `recorder config convert`.

use std::io::Write;
use std::path::Path;

use super::ExitCode;
use crate::cli::{FormArgs, ProtoArgs, RuleArgs, TargetForm};
use crate::config::rule::check::RuleContext;
use crate::config::rule::{self, Rule, RuleErrors};
use crate::config::{self, ConfigError, ConfigForm, LoadOptions, LoadedConfig, Schema};

/// Longest config error printed: a message built from a huge token stays
/// a message.
const MAX_ERROR_BYTES: usize = 4096;

/// Prints a config error (it carries its own `file:line:col` and caret),
/// with control characters escaped (the config is untrusted text) and cut
/// to MAX_ERROR_BYTES.
pub(crate) fn report(e: &ConfigError) -> ExitCode {
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

/// Prints rule errors (their text comes from the command line or a file:
/// shown escaped and cut as config errors are).
fn report_rules(e: &RuleErrors) -> ExitCode {
    let mut text = config::diagnostic::terminal_safe(&e.to_string());
    if text.len() > MAX_ERROR_BYTES * 4 {
        let cut = (0..=MAX_ERROR_BYTES * 4)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    eprintln!("{text}");
    ExitCode::Usage
}

/// Whether the rules' filters can be checked against the kernel's formats
/// now (tracefs mounted and readable: as root).
fn kernel_formats() -> Option<crate::sources::ftrace::tracefs::Tracefs> {
    use crate::sources::ftrace::tracefs::Tracefs;
    let t = Tracefs::discover().ok()?;
    t.read("events/header_page").ok().map(|_| t)
}

/// The rules given with `args`, each checked against `spec` and, where
/// tracefs can be read, the kernel's event formats: a usage error (every
/// refusal printed) when one does not fit. `checked` tells whether the
/// kernel check ran.
pub(crate) fn rules_for(
    spec: &config::RecorderSpec,
    args: &RuleArgs,
    ctx: RuleContext,
) -> Result<(Vec<Rule>, bool), ExitCode> {
    if args.is_empty() {
        return Ok((Vec::new(), false));
    }
    let rules =
        rule::read(&args.trigger_rule, &args.trigger_rules).map_err(|e| report_rules(&e))?;
    rule::check::against(&rules, spec, ctx).map_err(|e| report_rules(&e))?;
    let tracefs = kernel_formats();
    crate::sources::rules::check(&rules, spec, tracefs.as_ref()).map_err(|e| report_rules(&e))?;
    Ok((rules, tracefs.is_some()))
}

/// What each rule will do, for `config check` and `--dry-run`.
pub(crate) fn rules_plan(
    rules: &[Rule],
    spec: &config::RecorderSpec,
    kernel_checked: bool,
) -> String {
    if rules.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "rules (the recorder fires them itself, as producer {:?}):\n",
        rule::PRODUCER_NAME
    );
    for r in rules {
        s.push_str(&format!(
            "  {}\n    {}\n",
            r.text(),
            rule::describe(r, spec.trigger.as_ref())
        ));
    }
    if !kernel_checked
        && rules.iter().any(|r| {
            !r.condition.events().is_empty()
                || matches!(r.condition, rule::Condition::SchedLatency { .. })
        })
    {
        s.push_str("  note: filters are checked against the kernel's event formats when recording starts (tracefs is not readable here)\n");
    }
    s
}

/// Each rule as read, every value spelled out (defaults included), for
/// `config check --explain`.
fn rules_explained(rules: &[Rule]) -> String {
    let mut s = String::from("rules:\n");
    for r in rules {
        s.push_str(&format!(
            "  {} ({}): {}\n    condition: {}\n    action: {}\n    count: {}{}\n    rate: {} per {}{}\n",
            r.name,
            r.source.origin,
            r.text(),
            r.slice(r.condition_span),
            match r.action {
                rule::RuleAction::Trigger => format!("fire trigger {:?}", r.name),
                rule::RuleAction::Rotate => "rotate the output".into(),
            },
            r.count,
            if r.count == rule::DEFAULT_COUNT { " (default)" } else { "" },
            r.rate.n,
            rule::duration_text(r.rate.per),
            if r.rate == rule::DEFAULT_RATE { " (default)" } else { "" },
        ));
        if r.freeze.is_some() {
            s.push_str("    freeze: traceoff armed on the event, with the rule's filter\n");
        }
    }
    s
}

/// The rule context of a session whose segments come from the settings
/// file beside `file` (flags are the main job's).
fn context_beside(file: &Path) -> RuleContext {
    let policy = if file == Path::new("-") {
        None
    } else {
        config::segments::load_adjacent(file)
            .ok()
            .flatten()
            .map(|(_, p)| p)
    };
    policy.map_or_else(RuleContext::default, |p| RuleContext {
        segmented: p.rotates(),
        segment_budget: p.rotates() && (p.max_disk.is_some() || p.max_segments.is_some()),
    })
}

/// Loads `file` against our schema and the user's (`--proto`, …).
pub(crate) fn load(
    file: &Path,
    opts: LoadOptions,
    protos: &ProtoArgs,
) -> Result<LoadedConfig, ExitCode> {
    load_with_inputs(file, opts, protos).map(|(l, _)| l)
}

/// Every file a load read — the config, `--proto` files and their imports,
/// descriptor sets — by identity: `-o` must name none of them.
#[derive(Debug, Default)]
pub(crate) struct Inputs(
    Vec<config::proto_input::InputFile>,
    Option<std::path::PathBuf>,
);

impl Inputs {
    /// The input `out` is (the same file, through any path or link), if any.
    pub(crate) fn named_by(&self, out: &Path) -> Option<&Path> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(out).ok()?;
        self.0
            .iter()
            .find(|f| (f.dev, f.ino) == (m.dev(), m.ino()))
            .map(|f| f.path.as_path())
    }
}

/// As [`load`], with the files read.
pub(crate) fn load_with_inputs(
    file: &Path,
    opts: LoadOptions,
    protos: &ProtoArgs,
) -> Result<(LoadedConfig, Inputs), ExitCode> {
    let schema = Schema::load(&protos.user_protos()).map_err(|e| report(&e.into()))?;
    let loaded = config::load_path_in(file, opts, &schema).map_err(|e| report(&e))?;
    let mut inputs = schema.inputs().to_vec();
    let config_id = if file == Path::new("-") {
        rustix::fs::fstat(rustix::stdio::stdin()).ok()
    } else {
        rustix::fs::stat(file).ok()
    };
    if let Some(st) = config_id {
        inputs.push(config::proto_input::InputFile {
            dev: st.st_dev,
            ino: st.st_ino,
            path: file.to_path_buf(),
        });
    }
    Ok((loaded, Inputs(inputs, Some(file.to_path_buf()))))
}

/// Refuses (exit 2, printed) an `-o` that names one of `inputs`.
pub(crate) fn refuse_input_as_output(out: &Path, inputs: &Inputs) -> Result<(), ExitCode> {
    match inputs.named_by(out) {
        Some(input) => {
            let what = if inputs.1.as_deref() == Some(input) {
                "the config file".to_string()
            } else {
                format!("the input {}", input.display())
            };
            eprintln!(
                "error: -o {} is {what}: refusing to overwrite it",
                out.display()
            );
            Err(ExitCode::Usage)
        }
        None => Ok(()),
    }
}

/// Whether a session of `spec` opens the producer socket, and where (as
/// `recorder --config` without `--producer-socket` would).
fn producer_socket_line(spec: &config::RecorderSpec) -> String {
    use crate::transport::socket_path::Opening;
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

/// `--dry-run`: the config as text (for light mode, the one built), then
/// what `config check` says of it, each line a `#` comment, so the whole
/// can be saved and run with `--config`.
pub(crate) fn dry_run(loaded: &LoadedConfig, rules: &RuleArgs, ctx: RuleContext) -> ExitCode {
    let spec = match loaded.validate() {
        Ok(spec) => spec,
        Err(e) => return report(&e),
    };
    let (rules, kernel_checked) = match rules_for(&spec, rules, ctx) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let plan = format!(
        "{}: valid config\n{}{}{}",
        loaded.origin,
        config::plan::describe(&spec),
        producer_socket_line(&spec),
        rules_plan(&rules, &spec, kernel_checked)
    );
    let commented: String = plan
        .lines()
        .map(|l| {
            if l.is_empty() {
                "#\n".to_string()
            } else {
                format!("# {l}\n")
            }
        })
        .collect();
    // Names in the config and plan come from the user: shown escaped.
    let out = config::diagnostic::terminal_safe(&format!("{}\n{commented}", loaded.to_text()));
    match super::print_out(out) {
        Ok(()) => ExitCode::Success,
        Err(code) => code,
    }
}

/// For a config that records ftrace: whether this kernel takes the
/// sub-buffer size the recorder would choose, asked once (as root; else
/// said to be unknown).
fn subbuf_line(spec: &config::RecorderSpec) -> Option<String> {
    use crate::sources::ftrace::subbuf::{self, Settable};
    if !spec
        .data_sources
        .iter()
        .any(|d| matches!(d.kind, config::spec::SourceKind::Ftrace(_)))
    {
        return None;
    }
    let probed = rustix::process::geteuid()
        .is_root()
        .then(crate::sources::ftrace::tracefs::Tracefs::discover)
        .and_then(Result::ok)
        .and_then(|top| subbuf::probe(&top));
    let kb = subbuf::DEFAULT_SUBBUF_KB;
    Some(match probed {
        Some(Settable::Yes) => format!(
            "ftrace sub-buffers: {kb} KiB where a CPU's buffer holds {} of them (this kernel takes the setting)\n",
            subbuf::MIN_SUBBUFS
        ),
        Some(Settable::Refused(why)) => format!(
            "ftrace sub-buffers: this kernel refuses buffer_subbuf_size_kb ({why}): the recorder keeps the kernel's own size\n"
        ),
        Some(Settable::Absent) => {
            "ftrace sub-buffers: the kernel's own (no buffer_subbuf_size_kb before Linux 6.8)\n"
                .to_string()
        }
        None => format!(
            "ftrace sub-buffers: {kb} KiB where the kernel takes the setting (not asked: that needs root and tracefs)\n"
        ),
    })
}

/// Validates `file` and prints the plan; with `explain`, every field's fate.
pub(crate) fn check(file: &Path, form: &FormArgs, explain: bool, rule_args: &RuleArgs) -> ExitCode {
    let loaded = match load(file, form.options(), &form.protos) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let spec = match loaded.validate() {
        Ok(spec) => spec,
        Err(e) => return report(&e),
    };
    let (rules, kernel_checked) = match rules_for(&spec, rule_args, context_beside(file)) {
        Ok(r) => r,
        Err(code) => return code,
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
    // A config that only fires triggers opens no socket.
    if spec.activate_triggers.is_empty()
        && let Err(code) = super::print_out(producer_socket_line(&spec))
    {
        return code;
    }
    if let Some(line) = subbuf_line(&spec)
        && let Err(code) = super::print_out(line)
    {
        return code;
    }
    // Rules come from the command line or a file: shown escaped.
    let plan = config::diagnostic::terminal_safe(&rules_plan(&rules, &spec, kernel_checked));
    if let Err(code) = super::print_out(plan) {
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
                if let Err(e) = policy.check() {
                    eprintln!("error: {e}");
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
        if !rules.is_empty() {
            let text = config::diagnostic::terminal_safe(&rules_explained(&rules));
            if let Err(code) = super::print_out(text) {
                return code;
            }
        }
    }
    ExitCode::Success
}

/// Converts `file` to the other form (or `to`), onto `out` or stdout.
pub(crate) fn convert(
    file: &Path,
    to: Option<TargetForm>,
    out: Option<&Path>,
    form: &FormArgs,
) -> ExitCode {
    let (loaded, inputs) = match load_with_inputs(file, form.options(), &form.protos) {
        Ok(l) => l,
        Err(code) => return code,
    };
    if let Some(p) = out.filter(|p| *p != Path::new("-"))
        && let Err(code) = refuse_input_as_output(p, &inputs)
    {
        return code;
    }
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

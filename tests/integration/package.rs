//! What users install: the shell completions (each loads in its shell and
//! completes the subcommands) and the Debian package `scripts/package.sh`
//! builds (its files, its maintainer script, its binary run from the
//! extracted tree, lintian).

use crate::harness::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `recorder completions SHELL` in a file (in the directory returned with it).
fn completions(shell: &str) -> (tempfile::TempDir, PathBuf) {
    let o = Command::new(recorder_bin())
        .args(["completions", shell])
        .output()
        .expect("recorder completions");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join(format!("recorder.{shell}"));
    std::fs::write(&path, o.stdout).expect("write");
    (dir, path)
}

fn shell(program: &str, script: &str) -> Output {
    Command::new(program)
        .args(["-c", script])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The words bash completes after `line` (the script's `_recorder`).
fn bash_completes(script: &Path, line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split(' ').collect();
    let o = shell(
        "bash",
        &format!(
            "source {}; COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT={}; \
             _recorder recorder '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display(),
            words.join(" "),
            words.len() - 1,
            line.len(),
            words[words.len() - 1],
            words[words.len() - 2],
        ),
    );
    assert!(o.status.success(), "{}", out(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completion_loads_and_completes_subcommands() {
    let (_dir, script) = completions("bash");
    let o = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash");
    assert!(o.status.success(), "bash -n: {}", out(&o));
    assert_eq!(bash_completes(&script, "recorder con"), ["config"]);
    assert_eq!(bash_completes(&script, "recorder config ch"), ["check"]);
    let all = bash_completes(&script, "recorder ");
    for sub in [
        "inspect",
        "serve",
        "completions",
        "man-pages",
        "--time",
        "--dry-run",
    ] {
        assert!(all.iter().any(|w| w == sub), "{sub}: {all:?}");
    }
}

/// zsh and fish where they are installed (CI installs both).
#[test]
fn zsh_and_fish_completions_load_where_the_shells_are() {
    match on_path("zsh") {
        Some(_) => {
            let (_dir, script) = completions("zsh");
            let o = Command::new("zsh")
                .arg("-n")
                .arg(&script)
                .output()
                .expect("zsh");
            assert!(o.status.success(), "zsh -n: {}", out(&o));
            // Loaded as an autoload function, it defines the completer.
            let o = shell(
                "zsh",
                &format!(
                    "autoload -Uz compinit && compinit -u -D; source {}; whence -w _recorder",
                    script.display()
                ),
            );
            assert!(out(&o).contains("_recorder: function"), "{}", out(&o));
            let text = std::fs::read_to_string(&script).expect("script");
            assert!(
                text.contains("'config:Check or convert a config'"),
                "subcommands"
            );
        }
        None => assert!(!kernel_required(), "zsh missing under CI"),
    }
    match on_path("fish") {
        Some(_) => {
            let (_dir, script) = completions("fish");
            let o = Command::new("fish")
                .arg("-n")
                .arg(&script)
                .output()
                .expect("fish");
            assert!(o.status.success(), "fish -n: {}", out(&o));
            let o = shell(
                "fish",
                &format!("source {}; complete -C 'recorder con'", script.display()),
            );
            assert!(out(&o).starts_with("config\t"), "{}", out(&o));
            let o = shell(
                "fish",
                &format!(
                    "source {}; complete -C 'recorder config ch'",
                    script.display()
                ),
            );
            assert!(out(&o).starts_with("check\t"), "{}", out(&o));
        }
        None => assert!(!kernel_required(), "fish missing under CI"),
    }
}

/// The package `scripts/package.sh` built: `RECORDER_DEB` names it (CI
/// builds it once and sets it; building it here would compile a release).
fn deb() -> Result<PathBuf, need::Missing> {
    match std::env::var_os("RECORDER_DEB").map(PathBuf::from) {
        None => Err(need::Missing::peer(
            "RECORDER_DEB is not set (bash scripts/package.sh builds one)",
        )),
        Some(p) if !p.is_file() => Err(need::Missing::peer(format!(
            "no package at {}",
            p.display()
        ))),
        Some(p) => Ok(p),
    }
}

#[test]
fn the_debian_package_holds_the_binary_man_pages_completions_unit_and_user() {
    let deb = require!(deb());
    let name = deb.file_name().expect("name").to_string_lossy().to_string();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        name.starts_with(&format!("recorder_{version}-")) && name.ends_with(".deb"),
        "{name}"
    );
    let listing = Command::new("dpkg-deb")
        .arg("-c")
        .arg(&deb)
        .output()
        .expect("dpkg-deb");
    assert!(listing.status.success(), "{}", out(&listing));
    let listing = String::from_utf8_lossy(&listing.stdout).to_string();
    let files: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    // A page for recorder and every subcommand, as this binary makes them.
    let pages: Vec<String> = recorder::command::man_pages::pages()
        .expect("pages")
        .into_iter()
        .map(|(n, _)| format!("./usr/share/man/man1/{n}.gz"))
        .collect();
    assert!(pages.len() > 10, "{pages:?}");
    for want in [
        "./usr/bin/recorder",
        "./usr/share/bash-completion/completions/recorder",
        "./usr/share/zsh/vendor-completions/_recorder",
        "./usr/share/fish/vendor_completions.d/recorder.fish",
        "./usr/lib/systemd/system/recorder-serve.service",
        "./usr/share/doc/recorder/copyright",
    ]
    .into_iter()
    .chain(pages.iter().map(String::as_str))
    {
        assert!(
            files.contains(&want),
            "{want} is not in the package:\n{listing}"
        );
    }
    // The maintainer script creates the recorder system user.
    let ctl = tempfile::tempdir().expect("tmp");
    let o = Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(ctl.path())
        .output()
        .expect("dpkg-deb -e");
    assert!(o.status.success(), "{}", out(&o));
    let postinst = std::fs::read_to_string(ctl.path().join("postinst")).expect("postinst");
    assert!(
        postinst.contains("adduser --system") && postinst.contains(" recorder"),
        "{postinst}"
    );
    let o = Command::new("sh")
        .arg("-n")
        .arg(ctl.path().join("postinst"))
        .output()
        .expect("sh");
    assert!(o.status.success(), "sh -n postinst: {}", out(&o));
    let control = std::fs::read_to_string(ctl.path().join("control")).expect("control");
    assert!(control.contains("adduser"), "Depends on adduser: {control}");
    // Run as dpkg would on install, against a copy of /etc in a mount
    // namespace of its own (the machine's users stay as they are): it makes
    // the system user and group, and a second run changes nothing.
    if need::root().is_none() {
        let etc = tempfile::tempdir().expect("tmp");
        let copy = etc.path().join("etc");
        let o = Command::new("cp")
            .arg("-a")
            .arg("/etc")
            .arg(&copy)
            .output()
            .expect("cp");
        assert!(o.status.success(), "{}", out(&o));
        let postinst = ctl.path().join("postinst");
        let o = Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg(format!(
                "mount --bind {etc} /etc && sh {p} configure && sh {p} configure && \
                 getent passwd recorder && getent group recorder",
                etc = copy.display(),
                p = postinst.display()
            ))
            .output()
            .expect("unshare");
        let said = out(&o);
        assert!(o.status.success(), "{said}");
        let user = said
            .lines()
            .find(|l| l.starts_with("recorder:x:"))
            .unwrap_or_else(|| panic!("no recorder user: {said}"));
        // A system user: a low uid, no home, no login shell.
        let fields: Vec<&str> = user.split(':').collect();
        let uid: u32 = fields[2].parse().expect("uid");
        assert!(uid > 0 && uid < 1000, "{user}");
        assert_eq!(fields[5], "/nonexistent", "{user}");
        assert!(fields[6].ends_with("nologin"), "{user}");
    }

    // Unpacked into a throwaway directory, the binary runs from there.
    let root = tempfile::tempdir().expect("tmp");
    let o = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(root.path())
        .output()
        .expect("dpkg-deb -x");
    assert!(o.status.success(), "{}", out(&o));
    let o = Command::new(root.path().join("usr/bin/recorder"))
        .arg("--version")
        .env_clear()
        .output()
        .expect("the packaged recorder");
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("recorder {version}")
    );
    let unit = std::fs::read_to_string(
        root.path()
            .join("usr/lib/systemd/system/recorder-serve.service"),
    )
    .expect("unit");
    assert!(
        unit.contains("\nExecStart=/usr/bin/recorder serve "),
        "{unit}"
    );
    let o = Command::new("bash")
        .arg("-n")
        .arg(
            root.path()
                .join("usr/share/bash-completion/completions/recorder"),
        )
        .output()
        .expect("bash");
    assert!(o.status.success(), "{}", out(&o));

    // lintian, where it is installed (CI installs it): no error, no warning.
    match on_path("lintian") {
        Some(lintian) => {
            let o = Command::new(lintian).arg(&deb).output().expect("lintian");
            let said = out(&o);
            assert!(o.status.success(), "{said}");
            let tags: Vec<&str> = said
                .lines()
                .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
                .collect();
            assert!(tags.is_empty(), "lintian: {tags:?}");
        }
        None => assert!(!peers_required(), "lintian missing under CI"),
    }
}

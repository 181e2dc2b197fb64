//! When to cut a segment and how many to keep: the rotation policy, its
//! check, and the one pure decision the session calls after each write pass.

use std::time::Duration;

/// The rotation policy of a session, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RotationPolicy {
    /// Cut after the write pass that brings a segment to this many bytes.
    pub size: Option<u64>,
    /// Cut after the first write pass once a segment is this old.
    pub period: Option<Duration>,
    /// Keep at most this many segments on disk, the one being written included.
    pub(crate) max_segments: Option<u32>,
    /// Keep closed segments and the one being written within this many bytes.
    pub(crate) max_disk: Option<u64>,
    /// A shell command run with each closed segment's path.
    pub(crate) on_closed: Option<String>,
    /// How long each run of `on_closed` may take (default
    /// [`super::hook::DEFAULT_TIMEOUT`]).
    pub hook_timeout: Option<Duration>,
}

/// Why a segment was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RotateReason {
    Size,
    Period,
    /// `recorder rotate`, or a rule's `then rotate`.
    Requested,
}

/// A policy that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PolicyError {
    #[error(
        "{0} needs --rotate-size or --rotate-period (there is nothing to keep or delete without segments)"
    )]
    NeedsRotation(&'static str),
    #[error(
        "--max-disk {max_disk} needs --rotate-size of at most half of it, so a closed segment and the one being written fit"
    )]
    DiskTooSmall { max_disk: u64 },
    #[error(
        "--max-segments must be at least 2 (the segment being written is never deleted, and at least one closed one is kept)"
    )]
    TooFewSegments,
    #[error("{what} must be more than 0")]
    Zero { what: &'static str },
    #[error("--hook-timeout needs --on-segment-closed (it bounds that command's runs)")]
    TimeoutWithoutHook,
    #[error(transparent)]
    Hook(#[from] super::hook::HookCommandError),
}

impl RotationPolicy {
    /// Whether the output is cut into segments at all.
    pub(crate) fn rotates(&self) -> bool {
        self.size.is_some() || self.period.is_some()
    }

    /// Refuses settings that cannot be honoured.
    pub(crate) fn check(&self) -> Result<(), PolicyError> {
        if self.size == Some(0) {
            return Err(PolicyError::Zero {
                what: "--rotate-size",
            });
        }
        if self.period == Some(Duration::ZERO) {
            return Err(PolicyError::Zero {
                what: "--rotate-period",
            });
        }
        if self.hook_timeout == Some(Duration::ZERO) {
            return Err(PolicyError::Zero {
                what: "--hook-timeout",
            });
        }
        if self.hook_timeout.is_some() && self.on_closed.is_none() {
            return Err(PolicyError::TimeoutWithoutHook);
        }
        if let Some(cmd) = &self.on_closed {
            super::hook::shell_line(cmd)?;
        }
        if !self.rotates() {
            for (set, name) in [
                (self.max_segments.is_some(), "--max-segments"),
                // Without segments, --max-disk bounds CLONE_SNAPSHOT's
                // snapshots (the command checks the config is one).
                (self.on_closed.is_some(), "--on-segment-closed"),
            ] {
                if set {
                    return Err(PolicyError::NeedsRotation(name));
                }
            }
        }
        if matches!(self.max_segments, Some(n) if n < 2) {
            return Err(PolicyError::TooFewSegments);
        }
        if let Some(max_disk) = self.max_disk.filter(|_| self.rotates()) {
            match self.size {
                Some(size) if size.saturating_mul(2) <= max_disk => {}
                _ => return Err(PolicyError::DiskTooSmall { max_disk }),
            }
        }
        Ok(())
    }
}

/// The rotation decision, pure: after a write pass, with the segment at
/// `bytes` and `age` old, is it time to cut? Size first (it bounds disk use).
/// An empty segment is never cut (a quiet session does not make empty files).
pub(crate) fn rotation_due(
    policy: &RotationPolicy,
    bytes: u64,
    age: Duration,
) -> Option<RotateReason> {
    if bytes == 0 {
        return None;
    }
    if policy.size.is_some_and(|s| bytes >= s) {
        return Some(RotateReason::Size);
    }
    if policy.period.is_some_and(|p| age >= p) {
        return Some(RotateReason::Period);
    }
    None
}

/// A size or a duration as written that cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum ValueError {
    #[error("{text:?} is not a size (examples: 1048576, 256M, 2G)")]
    NotASize {
        text: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("{text:?}: unknown unit {unit:?} (use K, M, G, T or KB, MB, GB, TB)")]
    UnknownUnit { text: String, unit: String },
    #[error("{0:?} is too large")]
    TooLarge(String),
    #[error("{text:?} is not a duration ({source}; examples: 90s, 10m, 1h)")]
    NotADuration {
        text: String,
        #[source]
        source: humantime::DurationError,
    },
}

/// A byte size: `1048576`, `256K`, `256M`, `2G`, `1T` (powers of 1024, also
/// written `KiB`, `MiB`, …), or `KB`, `MB`, `GB`, `TB` (powers of 1000).
pub(crate) fn parse_size(s: &str) -> Result<u64, ValueError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|c| *c != '_').collect();
    let n: u64 = num.parse().map_err(|source| ValueError::NotASize {
        text: s.to_string(),
        source,
    })?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "k" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        u => {
            return Err(ValueError::UnknownUnit {
                text: s.to_string(),
                unit: u.to_string(),
            });
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| ValueError::TooLarge(s.to_string()))
}

/// A duration: `90s`, `10m`, `1h`, `1h30m`, `500ms`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    humantime::parse_duration(s.trim()).map_err(|source| ValueError::NotADuration {
        text: s.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1_000"), Ok(1000));
        assert_eq!(parse_size(" 4 K "), Ok(4096));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn the_decision() {
        let p = RotationPolicy {
            size: Some(100),
            period: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        let s = Duration::from_secs;
        assert_eq!(rotation_due(&p, 0, s(3600)), None);
        assert_eq!(rotation_due(&p, 99, s(59)), None);
        assert_eq!(rotation_due(&p, 100, s(0)), Some(RotateReason::Size));
        assert_eq!(rotation_due(&p, 1, s(60)), Some(RotateReason::Period));
        assert_eq!(rotation_due(&p, 500, s(60)), Some(RotateReason::Size));
        assert_eq!(
            rotation_due(&RotationPolicy::default(), 1 << 40, s(1 << 20)),
            None
        );
    }

    #[test]
    fn policies_that_cannot_work_are_refused() {
        let ok = RotationPolicy {
            size: Some(256 << 20),
            max_disk: Some(2 << 30),
            max_segments: Some(8),
            ..Default::default()
        };
        assert_eq!(ok.check(), Ok(()));
        let timeout_alone = RotationPolicy {
            hook_timeout: Some(Duration::from_secs(1)),
            ..ok.clone()
        };
        assert_eq!(timeout_alone.check(), Err(PolicyError::TimeoutWithoutHook));
        let zero_timeout = RotationPolicy {
            hook_timeout: Some(Duration::ZERO),
            on_closed: Some("true".into()),
            ..ok.clone()
        };
        assert!(matches!(
            zero_timeout.check(),
            Err(PolicyError::Zero { .. })
        ));
        let no_rotation = RotationPolicy {
            max_segments: Some(3),
            ..Default::default()
        };
        assert_eq!(
            no_rotation.check(),
            Err(PolicyError::NeedsRotation("--max-segments"))
        );
        let tight = RotationPolicy {
            size: Some(1 << 30),
            max_disk: Some((1 << 31) - 1),
            ..Default::default()
        };
        assert!(matches!(
            tight.check(),
            Err(PolicyError::DiskTooSmall { .. })
        ));
        let period_only_budget = RotationPolicy {
            period: Some(Duration::from_secs(60)),
            max_disk: Some(1 << 30),
            ..Default::default()
        };
        assert!(period_only_budget.check().is_err());
        let one = RotationPolicy {
            size: Some(10),
            max_segments: Some(1),
            ..Default::default()
        };
        assert_eq!(one.check(), Err(PolicyError::TooFewSegments));
        assert!(
            RotationPolicy {
                size: Some(0),
                ..Default::default()
            }
            .check()
            .is_err()
        );
    }
}
